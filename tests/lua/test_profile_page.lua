--[[
test_profile_page.lua -- ember.profile.page, the profiler's self-contained HTML page.

  - render: a synthetic report of two replicas (with memory by kind per replica and
    a projection by sharding mode) (a 'replica-skew' diagnosis with a
    distinctive message) and a timeline; every section is there, every string from
    the report is escaped (a hostile op name stays text), nothing points outside the
    page (no http: or https:, no src= or href= but '#' anchors and data:, no //);
  - the single-process form (no replicas: one bar "this process", no projection,
    no timeline) renders too; a timeline of more than MAX_EVENTS events draws the
    first MAX_EVENTS and says so; write() reports an unwritable path;
  - in headless Chromium (skipped, with the reason, when it is not installed; `make
    test` installs it): the screenshot is a real picture, --dump-dom shows the
    diagnosis, and the net log of both runs holds no http(s) request.

EMBER_PROFILE_PAGE_PNG=<path> keeps a copy of the screenshot there.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local page = require 'ember.profile.page'

local SKEW_MSG = 'Rank 1 waits 3.9 ms per step for rank 0 at the all-reduce, ' ..
                 'the zebra-quokka imbalance'
local HOSTILE = '<script>alert("x")</script>'
local URL_NAME = 'loader http://evil.example//x.png'

local MiB = 1024 * 1024

local function synthetic(nevents)
  local report = {
    steps = 12, step_s = 0.0123,
    breakdown = { input = 0.1, compute = 0.55, communication = 0.12, host = 0.18, idle = 0.05 },
    top_ops = {
      { name = 'conv2d', calls = 240, total_s = 0.05, mean_us = 208.3 },
      { name = 'matmul', calls = 480, total_s = 0.031, mean_us = 64.6 },
      { name = HOSTILE, calls = 12, total_s = 0.002, mean_us = 166.7 },
      { name = 'relu', calls = 240, total_s = 0.001, mean_us = 4.2 },
    },
    replicas = {
      { rank = 0, step_s = 0.0123, wait_s = 0.0001,
        breakdown = { input = 0.08, compute = 0.62, communication = 0.1, host = 0.2 },
        memory = { parameters = 4 * MiB, gradients = 4 * MiB, optimizer = 8 * MiB,
                   activations = 3 * MiB, peak = 19 * MiB } },
      { rank = 1, step_s = 0.0123, wait_s = 0.0039,
        breakdown = { input = 0.12, compute = 0.3, communication = 0.38, host = 0.15, idle = 0.05 },
        memory = { parameters = 4 * MiB, gradients = 4 * MiB, optimizer = 8 * MiB,
                   activations = 5.5 * MiB, peak = 21.5 * MiB } },
    },
    peak_bytes = { cpu = 123456789, ['cuda:0'] = 2147483648 },
    diagnosis = {
      { kind = 'replica-skew', message = SKEW_MSG },
      { kind = 'input-bound', message = 'The step waits for the loader 10% of the time & more.' },
    },
    ops_per_step = 153, mean_op_us = 35.2,
    projection = { gbps = 12.5, measured = true, grad_bytes = 421642, buckets = 2,
      rows = {
        { replicas = 2, step_s = 0.013, step_s_no_overlap = 0.014, efficiency = 0.95,
          efficiency_no_overlap = 0.88 },
        { replicas = 4, step_s = 0.0135, step_s_no_overlap = 0.0152, efficiency = 0.91,
          efficiency_no_overlap = 0.81 },
        { replicas = 8, step_s = 0.0141, step_s_no_overlap = 0.0168, efficiency = 0.87,
          efficiency_no_overlap = 0.73, modes = {
            plain = { step_s = 0.0141, step_s_no_overlap = 0.0168, efficiency = 0.87,
                      traffic_bytes = 7 * MiB, memory = { total = 19 * MiB } },
            optimizer = { step_s = 0.0152, step_s_no_overlap = 0.0179, efficiency = 0.81,
                          traffic_bytes = 10.5 * MiB, memory = { total = 12 * MiB,
                          parameters = 4 * MiB, gradients = 4 * MiB, optimizer = 1 * MiB } },
          } },
      }, mode = 'optimizer', modes = { 'plain', 'optimizer', 'gradients', 'parameters' },
      activations = 3 * MiB },
  }
  -- three steps of 10.5 ms; rank 0 and 1 main threads run ops inside ranges, the
  -- comm threads all-reduce, a loader worker loads.
  local tl = { tracks = { 'rank 0 main', 'rank 0 comm', 'rank 1 main', 'rank 1 comm',
                          URL_NAME },
               steps = { 0, 10500.2, 21000.7 }, events = {} }
  local ev = tl.events
  local cats = { 'op', 'backward', 'optimizer', 'copy' }
  local function add(track, name, cat, ts, dur) ev[#ev + 1] = { track = track, name = name,
    cat = cat, ts = ts, dur = dur } end
  for s = 0, 2 do
    local base = s * 10500.2
    for _, tr in ipairs({ 1, 3 }) do
      add(tr, 'step', 'range', base + 5, 10400)
      add(tr, 'next batch', 'data', base + 10, tr == 3 and 900 or 400)
      local t = base + (tr == 3 and 950 or 450)
      for k = 1, 40 do
        local c = cats[(k <= 20) and 1 or (k <= 36 and 2 or (k <= 39 and 3 or 4))]
        add(tr, k % 3 == 0 and 'conv2d' or (k % 3 == 1 and 'matmul' or HOSTILE), c, t, 150)
        t = t + 170
      end
      add(tr + 1, 'all-reduce bucket 1', 'collective', base + 4000, 1800)
      add(tr + 1, 'all-reduce bucket 2', 'collective', base + 6200, 1500)
      if tr == 1 then add(tr, 'wait for replicas', 'comm-wait', base + 7400, 2800) end
    end
    add(5, 'decode + batch', 'loader', base + 200, 7000)
  end
  -- more events than the page draws, when asked
  while nevents and #ev < nevents do add(1, 'tiny', 'op', (#ev % 30000) * 1.0, 0.5) end
  return report, tl
end

local function count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

-- No reference to anything outside the page.
local function self_contained(html, what)
  local low = html:lower()
  H.check(not low:find('http:', 1, true), what .. ': an http: reference')
  H.check(not low:find('https:', 1, true), what .. ': an https: reference')
  H.check(not html:find('//', 1, true), what .. ': a // (protocol-relative URL?)')
  H.check(not low:find('url(', 1, true) and not low:find('@import', 1, true),
          what .. ': CSS fetches something')
  H.check(not low:find('<script', 1, true), what .. ': a script element')
  local bad = {}
  for attr, q, v in low:gmatch('[%s"\'](src)%s*=%s*(["\']?)([^"\'%s>]*)') do
    if not (v:sub(1, 1) == '#' or v:sub(1, 5) == 'data:') then bad[#bad + 1] = attr .. '=' .. v end
  end
  for attr, q, v in low:gmatch('[%s"\'](href)%s*=%s*(["\']?)([^"\'%s>]*)') do
    if not (v:sub(1, 1) == '#' or v:sub(1, 5) == 'data:') then bad[#bad + 1] = attr .. '=' .. v end
  end
  H.check(#bad == 0, what .. ': references outside the page: ' .. table.concat(bad, ' '))
end

local report, timeline = synthetic()
local html

H.test('render: every section, two replicas', function()
  html = page.render(report, timeline)
  H.eq(type(html), 'string')
  H.check(html:sub(1, 15) == '<!DOCTYPE html>', 'a doctype first')
  H.check(html:find('</html>', 1, true), 'a complete document')
  for _, id in ipairs({ 'diagnosis', 'breakdown', 'timeline', 'ops', 'projection' }) do
    H.check(html:find('id="' .. id .. '"', 1, true), 'section ' .. id)
  end
  -- the diagnosis comes first, before any chart
  local d, b = html:find('id="diagnosis"', 1, true), html:find('id="breakdown"', 1, true)
  H.check(d and b and d < b, 'the diagnosis before the breakdown')
  H.check(html:find(page.escape(SKEW_MSG), 1, true), 'the skew message')
  H.check(html:find('>replica-skew</span>', 1, true), 'the skew badge')
  H.check(html:find('10%% of the time &amp; more.'), 'the second message, escaped')
  -- header
  H.check(html:find('12.30 ms', 1, true), 'mean step time')
  H.check(html:find('117.7 MiB', 1, true), 'peak memory of cpu')
  H.check(html:find('2.0 GiB', 1, true) and html:find('cuda&#58;0', 1, true), 'peak of cuda:0')
  -- breakdown: one bar per replica, percentages
  H.check(html:find('>rank 0</text>', 1, true) and html:find('>rank 1</text>', 1, true),
          'a bar per replica')
  H.check(not html:find('this process', 1, true), 'no single-process bar')
  H.check(html:find('62.0%', 1, true) and html:find('38.0%', 1, true), 'percentages')
  for _, p in ipairs({ 'input', 'compute', 'communication', 'host', 'idle' }) do
    H.check(html:find('</i>' .. p, 1, true), 'legend: ' .. p)
  end
  -- timeline: lanes, steps, axis, hover titles
  for _, t in ipairs({ 'rank 0 main', 'rank 0 comm', 'rank 1 main', 'rank 1 comm' }) do
    H.check(html:find('>' .. t .. '</text>', 1, true), 'lane ' .. t)
  end
  H.check(html:find('step 1 &middot; 10.50 ms', 1, true), 'step 1 labelled')
  H.eq(count(html, 'class="stepl"'), 3, 'step boundaries')
  H.check(html:find('>time (ms)</text>', 1, true), 'the x axis unit')
  H.check(html:find('<title>all-reduce bucket 1 (collective) 1.800 ms at 4.000 ms</title>', 1, true),
          'a hover title with name and duration')
  H.eq(count(html, '<rect class="k%d+"'), #timeline.events, 'every event drawn')
  -- ops table and projection
  H.check(html:find('<td class="name">conv2d</td><td>240</td><td>50.000</td><td>208.3</td>', 1, true),
          'the conv2d row')
  H.check(html:find('33.9%', 1, true), 'conv2d share of step (0.05 s / 12 steps / 12.3 ms)')
  H.check(html:find('<b>12.5 GB/s</b>', 1, true), 'the bandwidth')
  H.check(html:find('measured on this machine', 1, true), 'measured')
  H.check(html:find('<td>8</td><td>14.100</td><td>16.800</td>', 1, true), 'the 8-replica row')
  H.check(html:find('95.0%', 1, true) and html:find('73.0%', 1, true), 'efficiencies')
  -- by sharding mode: this run's mode in bold, bytes sent and memory per replica
  H.check(html:find('<table id="modes">', 1, true), 'the table by mode')
  H.check(html:find('<tr style="font-weight:600"><td>8</td><td>optimizer (ZeRO-1)</td>' ..
    '<td>15.200</td><td>17.900</td><td>81.0%</td><td>10.5 MiB</td><td title="parameters ' ..
    '4.0 MiB, gradients 4.0 MiB, optimizer 1.0 MiB, activations &ndash;">12.0 MiB</td></tr>',
    1, true), 'the optimizer row')
  H.check(html:find('<tr><td>8</td><td>plain data parallel</td><td>14.100</td>', 1, true),
          'the plain row')
  H.eq(count(html, '<td>ZeRO'), 0)
end)

H.test('render: memory per replica by kind', function()
  local s = html:find('id="memory"', 1, true)
  local b, t = html:find('id="breakdown"', 1, true), html:find('id="timeline"', 1, true)
  H.check(s and b < s and s < t, 'after the breakdown, before the timeline')
  local sec = html:sub(s, html:find('</section>', s, true))
  H.check(sec:find('<tr><td>rank 0</td><td>4.0 MiB</td><td>4.0 MiB</td><td>8.0 MiB</td>' ..
    '<td>3.0 MiB</td><td>19.0 MiB</td></tr>', 1, true), 'rank 0 row')
  H.check(sec:find('<tr><td>rank 1</td><td>4.0 MiB</td><td>4.0 MiB</td><td>8.0 MiB</td>' ..
    '<td>5.5 MiB</td><td>21.5 MiB</td></tr>', 1, true), 'rank 1 row')
  -- one bar per replica: four kinds and a peak mark each, on the scale of 21.5 MiB
  H.eq(count(sec, '<title>rank %d [a-z]+%: '), 10, 'kinds drawn, and the peaks')
  H.eq(count(sec, '<title>rank %d peak%: '), 2, 'peaks marked')
  local w = tonumber(sec:match('<rect x="[%d.]+" y="%d+" width="([%d.]+)" height="%d+" ' ..
    'fill="[^"]+"><title>rank 1 activations'))
  H.close(w, 5.5 / 21.5 * (1060 - 4 - 160), 0.01, 'widths to scale')
  for _, k in ipairs({ 'parameters', 'gradients', 'optimizer', 'activations', 'peak' }) do
    H.check(sec:find('</i>' .. k, 1, true), 'legend: ' .. k)
  end
end)

H.test('render: escaped and self-contained', function()
  H.check(not html:find(HOSTILE, 1, true), 'the hostile op name is not raw')
  H.check(html:find('&lt;script&gt;alert(&quot;x&quot;)&lt;&#47;script&gt;', 1, true),
          'the hostile op name shows as text')
  H.check(html:find('loader http&#58;&#47;&#47;evil.example', 1, true), 'a URL-like name is text')
  self_contained(html, 'page')
  H.check(html:find('Content-Security-Policy', 1, true), 'a CSP forbids fetches')
end)

H.test('render: one process, no projection, no timeline', function()
  local r = synthetic()
  r.replicas, r.projection = {}, nil
  local h = page.render(r, nil)
  H.check(h:find('>this process</text>', 1, true), 'one bar: this process')
  H.eq(count(h, 'ms / step</text>'), 1, 'one bar')
  H.check(h:find('No scaling projection', 1, true), 'no projection said')
  H.check(h:find('No timeline', 1, true), 'no timeline said')
  H.check(h:find('replica (one process)', 1, true), 'one replica in the header')
  H.check(h:find('No memory by kind', 1, true), 'no memory said')
  r.memory = { parameters = 1024, gradients = 1024, optimizer = 2048, activations = 512,
               peak = 4608 }
  local hm = page.render(r, nil)
  H.check(hm:find('<tr><td>this process</td><td>1.0 KiB</td><td>1.0 KiB</td><td>2.0 KiB</td>' ..
    '<td>512 B</td><td>4.5 KiB</td></tr>', 1, true), 'this process\'s memory')
  self_contained(h, 'one-process page')
  -- an empty report still renders
  local e = page.render({}, { tracks = {}, steps = {}, events = {} })
  H.check(e:find('No diagnosis', 1, true) and e:find('No ops', 1, true), 'an empty report')
  self_contained(e, 'empty page')
end)

H.test('render: a big timeline is cut to MAX_EVENTS', function()
  local r, tl = synthetic(page.MAX_EVENTS + 5000)
  local h = page.render(r, tl)
  H.eq(count(h, '<rect class="k%d+"'), page.MAX_EVENTS, 'events drawn')
  H.check(h:find(('the first %s are drawn'):format(
    tostring(page.MAX_EVENTS):reverse():gsub('(%d%d%d)', '%1,'):reverse():gsub('^,', '')), 1, true),
    'the page says so')
  H.check(#h < 6e6, ('the page stays small (%d bytes)'):format(#h))
end)

-- -- Files and Chromium -------------------------------------------------------------------

local function sh(cmd)
  local ok = os.execute(cmd)
  return ok == true or ok == 0
end

local slurp = H.read

local tmp = (function()
  local p = io.popen('mktemp -d /tmp/ember-page-XXXXXX 2>/dev/null')
  local d = p and p:read('*l')
  if p then p:close() end
  return d
end)()
local path = tmp and (tmp .. '/page.html')

H.test('write', function()
  H.check(tmp, 'a temporary directory')
  H.eq(page.write(path, report, timeline), true, 'written')
  H.eq(slurp(path), html, 'the file holds the page')
  local ok, err = page.write(tmp .. '/no/such/dir/page.html', report, timeline)
  H.eq(ok, nil, 'an unwritable path')
  H.check(type(err) == 'string' and err:find('profile page', 1, true), 'says what failed')
end)

-- The requests a page made, from a Chromium net log (one event a line): the
-- URL_REQUEST_START_JOB events whose initiator is an origin -- the page's, "null"
-- for a file: page. Chromium's own background requests (component updates, the
-- network clock, the spell-check dictionary...) are there too, with initiator
-- "not an origin"; they are not the page's. nil when the file is not a net log.
local function page_requests(path)
  local s = slurp(path)
  if not s or not s:find('"constants"', 1, true) then return nil end
  local events = s:find('"events"', 1, true)
  if not events then return nil end
  local urls = {}
  for line in s:sub(events):gmatch('[^\n]+') do
    local initiator = line:match('"initiator":"([^"]*)"')
    local url = line:match('"url":"([^"]*)"')
    if url and ((initiator and initiator ~= 'not an origin') or
                line:find('site=file://', 1, true)) then
      urls[#urls + 1] = url
    end
  end
  return urls
end

-- The requests that left the machine's files: anything but file:, data:, blob:, about:.
local function outside(urls)
  local bad = {}
  for _, u in ipairs(urls or {}) do
    local scheme = (u:match('^(%a[%w+.-]*):') or ''):lower()
    if scheme ~= 'file' and scheme ~= 'data' and scheme ~= 'blob' and scheme ~= 'about' then
      bad[#bad + 1] = u
    end
  end
  return bad
end

local function chromium_path()
  local p = io.popen('command -v chromium 2>/dev/null')
  local c = p and p:read('*l')
  if p then p:close() end
  return c ~= '' and c or nil
end

-- A check whose failure keeps the temporary directory (Chromium's logs) for a look.
local keep_tmp = false
local function C(ok, msg)
  if not H.check(ok, msg, 2) then keep_tmp = true end
end

H.test('headless Chromium: screenshot, DOM, no network', function()
  local chromium = chromium_path()
  if not chromium then
    H.skip('chromium is not installed (make deps-test installs it)')
    return
  end
  if not (tmp and slurp(path)) then
    H.skip('no page was written')
    return
  end
  local function run(name, extra, out, file)
    local cmd = ("timeout 90 '%s' --headless --no-sandbox --disable-gpu " ..
      "--disable-background-networking --no-first-run --disable-extensions " ..
      "--user-data-dir='%s/%s-profile' --log-net-log='%s/%s-net.json' " ..
      "--window-size=1200,1600 %s 'file://%s' > '%s' 2> '%s/%s.log'"):format(
      chromium, tmp, name, tmp, name, extra, file or path, out or '/dev/null', tmp, name)
    return sh(cmd)
  end
  -- the screenshot
  local png = tmp .. '/page.png'
  local ok = run('shot', ("--screenshot='%s'"):format(png))
  C(ok, 'chromium --screenshot exits 0 (see ' .. tmp .. '/shot.log)')
  local img = slurp(png)
  C(img and img:sub(1, 8) == '\137PNG\r\n\26\n', 'a PNG')
  C(img and #img > 10 * 1024, ('a real picture (%d bytes)'):format(img and #img or 0))
  local keep = os.getenv('EMBER_PROFILE_PAGE_PNG')
  if keep and keep ~= '' and img then
    local f = io.open(keep, 'wb')
    if f then f:write(img) f:close() end
  end
  -- the DOM as Chromium built it
  ok = run('dom', '--dump-dom', tmp .. '/dom.html')
  C(ok, 'chromium --dump-dom exits 0 (see ' .. tmp .. '/dom.log)')
  local dom = slurp(tmp .. '/dom.html') or ''
  C(dom:find(SKEW_MSG, 1, true), 'the dumped page shows the skew message')
  C(dom:find('replica-skew', 1, true), 'and its badge')
  C(dom:find('rank 1 comm', 1, true), 'and the timeline lanes')
  C(dom:find('Memory per replica', 1, true) and dom:find('rank 1 activations', 1, true),
    'and the memory per replica')
  C(dom:find('By sharding mode', 1, true), 'and the projection by mode')
  -- nothing left the page
  for _, name in ipairs({ 'shot', 'dom' }) do
    local urls = page_requests(tmp .. '/' .. name .. '-net.json')
    C(urls, name .. ': a net log was written')
    local bad = outside(urls)
    C(#bad == 0, name .. ': requests left the page: ' .. table.concat(bad, ' '))
  end
  -- ... and the net log would have shown one: a page with an image on a closed
  -- local port (connection refused at once, nothing leaves the machine)
  local ctl = io.open(tmp .. '/control.html', 'wb')
  ctl:write('<!DOCTYPE html><html><body><p>control</p>' ..
            '<img src="http://127.0.0.1:9/ember-leak.png"></body></html>')
  ctl:close()
  run('control', '--dump-dom', '/dev/null', tmp .. '/control.html')
  local leaks = outside(page_requests(tmp .. '/control-net.json'))
  C(#leaks >= 1 and leaks[1]:find('ember-leak.png', 1, true),
          'the net log shows a page request (control page): ' .. table.concat(leaks, ' '))
end)

if keep_tmp then
  print('  (Chromium\'s logs and outputs are kept in ' .. tmp .. ')')
elseif tmp and tmp:match('^/tmp/ember%-page%-') then
  sh(("rm -rf '%s'"):format(tmp))
end
H.done()
