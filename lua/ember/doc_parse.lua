--[[
ember.doc_parse -- reading the Markdown of ember's docs: the reference entries
(for help() and the coverage test) and the fenced code blocks (for the doc
test, tools/doctest.lua).

  entries(text, page)  -> { {names = {...}, text = ..., page = page, line = n}, ... }
  blocks(text)         -> { {info = 'lua norun', code = ..., line = n}, ... }
  first_sentence(entry_text) -> the entry's first sentence of prose
  index_pages(text)    -> the pages reference/README.md links to
  list_md(dir)         -> the sorted names of dir's *.md files

An entry starts at a `### ` heading whose text begins with a name in backticks
(`### \`em.sum\`, \`Tensor:sum\``: names separated by ", ", the rest of the line
ignored) and runs to the next heading of level 1 to 3. Headings inside fenced
blocks are code, not headings. A fence is indented by 3 spaces at most (as in
CommonMark): one indented further is text of an indented code block, as in
the example of an entry that docs/reference/README.md shows.
]]
local M = {}

local function lines_of(text)
  local lines = {}
  for l in (text:gsub('\r\n', '\n') .. '\n'):gmatch('([^\n]*)\n') do lines[#lines + 1] = l end
  return lines
end
M.lines_of = lines_of

-- The names of a heading's text ("`a`, `b` (alias)" -> {a, b}), or nil.
function M.heading_names(s)
  local names = {}
  while true do
    local n, rest = s:match('^`([^`]+)`(.*)$')
    if not n then break end
    names[#names + 1] = n
    if rest:sub(1, 3) ~= ', `' then break end
    s = rest:sub(3)
  end
  return #names > 0 and names or nil
end

function M.entries(text, page)
  local lines, out = lines_of(text), {}
  local fence, cur = nil, nil
  local function close(upto)
    if cur then
      local last = upto
      while last > cur.line and lines[last]:match('^%s*$') do last = last - 1 end
      cur.text = table.concat(lines, '\n', cur.line, last)
      out[#out + 1] = cur
      cur = nil
    end
  end
  for i, l in ipairs(lines) do
    local marker = l:match('^ ? ? ?(```+)') or l:match('^ ? ? ?(~~~+)')
    if fence then
      if marker and l:match('^%s*' .. fence .. '%s*$') then fence = nil end
    elseif marker then
      fence = marker
    else
      local level, rest = l:match('^(#+)%s+(.*)$')
      if level and #level <= 3 then
        close(i - 1)
        local names = #level == 3 and M.heading_names(rest)
        if names then cur = { names = names, page = page, line = i } end
      end
    end
  end
  close(#lines)
  return out
end

function M.blocks(text)
  local lines, out = lines_of(text), {}
  local i = 1
  while i <= #lines do
    local indent, fence, info = lines[i]:match('^( ? ? ?)(```+)%s*(.-)%s*$')
    if fence then
      local start, body = i, {}
      i = i + 1
      while i <= #lines and not lines[i]:match('^%s*' .. fence .. '%s*$') do
        body[#body + 1] = lines[i]:sub(#indent + 1)
        i = i + 1
      end
      out[#out + 1] = { info = info, code = table.concat(body, '\n'), line = start,
                        closed = i <= #lines }
    end
    i = i + 1
  end
  return out
end

-- The first sentence of an entry's prose: after the heading and the signature
-- line(s) in code spans, up to the first '. ' or the paragraph's end.
function M.first_sentence(text)
  local para, started, fence = {}, false, false
  for l in (text .. '\n'):gmatch('([^\n]*)\n') do
    if l:match('^%s*```') then
      if started then break end
      fence = not fence
    elseif not fence and not l:match('^#') then
      if l:match('^%s*$') then
        if started then break end
      elseif started or not l:match('^%s*`') then
        started = true
        para[#para + 1] = l:match('^%s*(.-)%s*$')
      end
    end
  end
  local s = table.concat(para, ' ')
  s = s:match('^(.-[%.!?])%s') or s
  if #s > 110 then s = s:sub(1, 107) .. '...' end
  return s
end

-- -- The pages ------------------------------------------------------------------------------
-- The pages the reference's index (reference/README.md) links to, in its order:
-- help reads these (a Lua state may have no shell to list a folder with), and the
-- coverage test checks that the index links every page of the folder.
function M.index_pages(index_text)
  local out, seen = {}, {}
  for f in index_text:gmatch('%]%(([%w_%-]+%.md)%)') do
    if not seen[f] then seen[f] = true; out[#out + 1] = f end
  end
  return out
end

-- The sorted names of dir's *.md files (through the shell: for the tools and tests).
function M.list_md(dir)
  local out = {}
  local p = io.popen("ls '" .. dir:gsub("'", "'\\''") .. "' 2>/dev/null")
  if p then
    for f in p:lines() do if f:match('%.md$') then out[#out + 1] = f end end
    p:close()
  end
  table.sort(out)
  return out
end

return M
