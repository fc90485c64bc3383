--[[
ember.nn.pad -- em.nn.F.pad(x, pads, {mode = 'constant'|'reflect'|'replicate'|'circular',
value}): pads in PyTorch's order, the last dim first: {left, right} pads the last
dim, {left, right, top, bottom} the last two, and so on. Negative constant pads
crop. Built from cat, narrow and index_select, so autograd and every device follow.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local raise, kind = core.raise, core.kind

local function shape_str(s) return '[' .. table.concat(s, ',') .. ']' end

return function(nn)
  local F = nn.F
  local modes = { constant = true, reflect = true, replicate = true, circular = true }

  -- The source index (1-based) of output position p (1-based, may lie outside 1..n).
  local source = {
    reflect = function(p, n)
      local period = 2 * (n - 1)
      local q = (p - 1) % period
      return q < n and q + 1 or period - q + 1
    end,
    replicate = function(p, n) return math.min(math.max(p, 1), n) end,
    circular = function(p, n) return (p - 1) % n + 1 end,
  }

  function F.pad(x, pads, o)
    if not em.is_tensor(x) then raise('pad: expected a tensor input, got ' .. kind(x)) end
    if type(o) == 'string' then o = { mode = o } end
    o = o or {}
    local mode, value = o.mode or 'constant', o.value or 0
    if not modes[mode] then
      raise(("pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got %s"):format(tostring(mode)))
    end
    if type(pads) ~= 'table' or #pads % 2 ~= 0 then
      raise('pad: pads must be a list of an even length {left, right[, top, bottom, ...]}, got ' ..
        (type(pads) == 'table' and (#pads .. ' values') or kind(pads)))
    end
    local nd, xs = x:dim(), x.shape
    if #pads / 2 > nd then
      raise(('pad: %d pads name %d dims, but the input %s has only %d'):format(#pads, #pads / 2,
        shape_str(xs), nd))
    end
    local y = x
    for i = 1, #pads / 2 do
      local d = nd - i + 1
      local lo, hi = pads[2 * i - 1], pads[2 * i]
      if lo % 1 ~= 0 or hi % 1 ~= 0 then raise('pad: pads must be integers') end
      local n = y.shape[d]
      if mode == 'constant' then
        if lo < 0 then y = y:narrow(d, 1 - lo, n + lo); n = n + lo; lo = 0 end
        if hi < 0 then y = y:narrow(d, 1, n + hi); hi = 0 end
        if n + lo + hi < 0 or y.shape[d] < 0 then raise('pad: negative pads crop more than the dim holds') end
        local parts = {}
        local function block(w)
          local s = y.shape
          s[d] = w
          return em.full(s, value, { dtype = y.dtype, device = y.device })
        end
        if lo > 0 then parts[#parts + 1] = block(lo) end
        parts[#parts + 1] = y
        if hi > 0 then parts[#parts + 1] = block(hi) end
        if #parts > 1 then y = em.cat(parts, d) end
      else
        if lo < 0 or hi < 0 then raise(("pad: negative pads need mode 'constant', got '%s'"):format(mode)) end
        if mode == 'reflect' and (lo >= n or hi >= n) then
          raise(("pad: reflect pads (%d, %d) of dim %d must be smaller than its size %d (input %s)")
            :format(lo, hi, d, n, shape_str(xs)))
        end
        if mode == 'circular' and (lo > n or hi > n) then
          raise(("pad: circular pads (%d, %d) of dim %d must be at most its size %d (input %s)")
            :format(lo, hi, d, n, shape_str(xs)))
        end
        if n == 0 then raise(('pad: %s pad of an empty dim %d'):format(mode, d)) end
        if lo > 0 or hi > 0 then
          local idx = {}
          for p = 1 - lo, n + hi do idx[#idx + 1] = source[mode](p, n) end
          local it = em.tensor(idx, { dtype = 'int64', device = y.device })
          y = y:index_select(d, it)
        end
      end
    end
    return y
  end
end
