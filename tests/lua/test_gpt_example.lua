--[[
test_gpt_example.lua -- examples/gpt_model.lua and examples/gpt.lua: the
embedding and one block's causal attention against the same arithmetic written
out as loops over plain Lua numbers; causality (a later token never changes an
earlier position's logits); gradients of the whole model by gradcheck in
float64; the example's run: its loss falls by a real margin in 30 steps, a seed
fixes every printed figure, an emulated GPU prints the CPU's losses, two
replicas (plain and --shard parameters) print the losses of one replica on the
global batch, and bad options are clear errors.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local ember = arg[-1] or 'ember'
local GPT = dofile(dir .. '../../examples/gpt_model.lua')

local F64 = { dtype = 'float64' }
local function tiny(o)
  o = o or {}
  em.manual_seed(o.seed or 7)
  return GPT.build{ vocab = o.vocab or 6, layers = o.layers or 2, dim = o.dim or 8,
                    heads = o.heads or 2, context = o.context or 5, dtype = 'float64' }
end
local function ids_of(rows) return em.tensor(rows, { dtype = 'int64' }) end

-- -- Forward against loops --------------------------------------------------------------------
H.test('the embedding adds token and position rows', function()
  local m = tiny()
  local emb = m[1]
  local ids = ids_of({ { 3, 1, 6, 6 }, { 2, 5, 4, 1 } })
  local got = emb(ids):totable()
  local tok, pos = emb.tok.weight:totable(), emb.pos.weight:totable()
  local want, gotf = {}, {}
  for b = 1, 2 do
    for t = 1, 4 do
      for c = 1, 8 do
        want[#want + 1] = tok[ids:totable()[b][t]][c] + pos[t][c]
        gotf[#gotf + 1] = got[b][t][c]
      end
    end
  end
  H.close(gotf, want, 1e-12, 'token + position')
  H.eq(m[1].pos.weight.shape, { 5, 8 }, 'one position row per context slot')
  H.raises(function() emb(ids_of({ { 1, 2, 3, 4, 5, 6 } })) end, 'GPTEmbedding', 'time <= 5', '[1,6]')
  H.raises(function() emb(ids_of({ 1, 2 })) end, 'GPTEmbedding', '(batch, time)', '[2]')
end)

-- softmax(q k^T / sqrt(D)) v over keys j <= i, per batch row and head, then the
-- output projection: every sum written out.
local function attention_by_loops(attn, x)
  local X = x:totable()
  local B, T, C, Hn = x:size(1), x:size(2), x:size(3), attn.heads
  local D = C / Hn
  local Wq, bq = attn.qkv.weight:totable(), attn.qkv.bias:totable()
  local Wp, bp = attn.proj.weight:totable(), attn.proj.bias:totable()
  local out = {}
  for b = 1, B do
    local qkv = {}                           -- qkv[t][o], o in 1..3C
    for t = 1, T do
      qkv[t] = {}
      for o = 1, 3 * C do
        local s = bq[o]
        for c = 1, C do s = s + Wq[o][c] * X[b][t][c] end
        qkv[t][o] = s
      end
    end
    local y = {}                             -- y[t][c], heads side by side
    for t = 1, T do y[t] = {} end
    for h = 0, Hn - 1 do
      for i = 1, T do
        local w, mx = {}, -math.huge
        for j = 1, i do
          local s = 0
          for d = 1, D do s = s + qkv[i][h * D + d] * qkv[j][C + h * D + d] end
          w[j] = s / math.sqrt(D)
          mx = math.max(mx, w[j])
        end
        local z = 0
        for j = 1, i do w[j] = math.exp(w[j] - mx); z = z + w[j] end
        for d = 1, D do
          local s = 0
          for j = 1, i do s = s + w[j] / z * qkv[j][2 * C + h * D + d] end
          y[i][h * D + d] = s
        end
      end
    end
    for t = 1, T do
      for o = 1, C do
        local s = bp[o]
        for c = 1, C do s = s + Wp[o][c] * y[t][c] end
        out[#out + 1] = s
      end
    end
  end
  return out
end

H.test('causal attention equals the loops, also on a strided input', function()
  local m = tiny()
  local attn = m[2].attn
  em.manual_seed(3)
  local x = em.randn({ 2, 5, 8 }, F64)
  H.close(H.flat(attn(x)), attention_by_loops(attn, x), 1e-10, 'attention (2, 5, 8)')
  -- a transposed (non-contiguous) input of the same values
  local xt = x:transpose(1, 2):contiguous():transpose(1, 2)
  H.check(not xt:is_contiguous(), 'the input is strided')
  H.close(H.flat(attn(xt)), attention_by_loops(attn, x), 1e-10, 'attention, strided input')
  -- shorter sequences than the context
  local x3 = x:narrow(2, 1, 3)
  H.close(H.flat(attn(x3)), attention_by_loops(attn, x3), 1e-10, 'attention, T = 3')
  -- the block: x + attn(ln1 x), then + mlp(ln2 .)
  local blk = m[2]
  local h = x + em.tensor(attention_by_loops(attn, blk.ln1(x)), F64):view(2, 5, 8)
  local want = h + blk.mlp(blk.ln2(h))
  H.close(H.flat(blk(x)), H.flat(want), 1e-10, 'block = two residual branches')
end)

H.test('causal mask: keys after the query are hidden', function()
  H.eq(GPT.causal_mask(3, 'cpu'):totable(),
       { { true, false, false }, { true, true, false }, { true, true, true } }, 'mask(3)')
end)

H.test('causality: a later token never changes earlier logits', function()
  local m = tiny()
  local a = ids_of({ { 1, 2, 3, 4, 5 }, { 6, 5, 4, 3, 2 } })
  local b = ids_of({ { 1, 2, 3, 6, 5 }, { 6, 5, 4, 1, 2 } })   -- position 4 differs
  local la, lb = m(a), m(b)
  H.eq(la.shape, { 2, 5, 6 }, 'logits (batch, time, vocab)')
  H.close(H.flat(la:narrow(2, 1, 3)), H.flat(lb:narrow(2, 1, 3)), 1e-13, 'positions 1..3')
  local d4 = (la:narrow(2, 4, 2) - lb:narrow(2, 4, 2)):abs():max():item()
  H.check(d4 > 1e-6, 'positions 4..5 do see the change: ' .. d4)
  -- a prefix alone gives the same logits as inside the longer sequence
  H.close(H.flat(m(a:narrow(2, 1, 2))), H.flat(la:narrow(2, 1, 2)), 1e-12, 'prefix')
end)

-- -- Gradients ----------------------------------------------------------------------------------
H.test('gradcheck of the whole model (float64, every parameter)', function()
  local m = tiny({ vocab = 5, layers = 1, dim = 4, heads = 2, context = 4 })
  -- larger weights than GPT's 0.02, so that every path's gradient is far from 0
  em.no_grad(function()
    for _, p in ipairs(m:parameters()) do p:add_(em.randn(p.shape, F64) * 0.3) end
  end)
  local ids = ids_of({ { 1, 3, 5, 2 }, { 4, 4, 1, 3 } })
  local y = ids_of({ 3, 5, 2, 1, 4, 1, 3, 2 })
  local params = m:parameters()
  H.eq(#params, 18, 'tok, pos, LN 2, qkv 2, proj 2, LN 2, mlp 4, head LN 2, out 2')
  local ok, err = pcall(em.autograd.gradcheck, function()
    return em.nn.F.cross_entropy(m(ids):view(8, 5), y)
  end, params, { atol = 1e-6, rtol = 1e-4 })
  H.check(ok, err)
  -- and the logits themselves, with respect to a block's input
  local x = em.randn({ 1, 3, 4 }, F64):requires_grad_()
  ok, err = pcall(em.autograd.gradcheck, function(v) return m[2](v) end, { x })
  H.check(ok, err)
end)

-- -- The example --------------------------------------------------------------------------------
local G = dofile(dir .. 'gpt_run.lua')(dir, ember)
local run, losses, small = G.run, G.losses, G.small
local quick = ('--file %s --layers 2 --dim 32 --heads 4 --context 32 --lr 3e-3 '):format(small)

H.test('30 steps: the loss falls by a real margin, and it samples', function()
  local out, rc = run('', quick .. '--steps 30 --every 10 --batch 16 --sample 50')
  H.eq(rc, 0, out)
  local l = losses(out)
  H.eq(#l, 4, 'steps 1, 10, 20, 30 print a loss:\n' .. out)
  if #l ~= 4 then return end
  -- a uniform guess over the vocabulary (~60 bytes) costs ln 60 = 4.1
  H.check(l[1] > 3.8 and l[1] < 4.6, 'starts near ln(vocab): ' .. l[1])
  H.check(l[4] < l[1] - 1.0, ('falls by more than 1 nat: %.4f -> %.4f'):format(l[1], l[4]))
  local sample = out:match('sample %(temperature 0%.8%):\n(.*)\nexit=')
  H.check(sample and #sample == #'The ' + 50 and sample:sub(1, 4) == 'The ',
          'the prompt and 50 bytes: ' .. tostring(sample))
end)

H.test('the seed fixes every figure; another seed changes them', function()
  local args = quick .. '--steps 6 --every 2 --batch 4 --sample 30 --temperature 1'
  local a = run('', args .. ' --seed 5')
  local b = run('', args .. ' --seed 5')
  local c = run('', args .. ' --seed 6')
  H.eq(b, a, 'same seed, same output')
  H.check(#losses(a) == 4 and losses(a)[1] ~= losses(c)[1], 'another seed: other losses')
  local sa = a:match('sample[^\n]*\n(.*)\nexit=')
  local sc = c:match('sample[^\n]*\n(.*)\nexit=')
  H.check(sa and sc and sa ~= sc, 'another seed: another sample')
  -- greedy sampling is the argmax, so also a function of the weights alone
  local g1 = run('', args .. ' --seed 5 --temperature 0')
  local g2 = run('', args .. ' --seed 5 --temperature 0')
  H.eq(g2, g1, 'greedy sampling repeats')
end)

H.test('--replicas 2 prints the losses of one replica on the global batch', function()
  local args = quick .. '--steps 8 --every 1 --sample 20 --temperature 0'
  local one, rc1 = run('', args .. ' --batch 8')
  local two, rc2 = run('--replicas 2', args .. ' --batch 4')
  local zero3, rc3 = run('--replicas 2', args .. ' --batch 4 --shard parameters')
  H.eq({ rc1, rc2, rc3 }, { 0, 0, 0 }, one .. two .. zero3)
  local l1, l2, l3 = losses(one), losses(two), losses(zero3)
  H.eq(#l1, 8, 'eight losses:\n' .. one)
  H.close(l2, l1, 2e-4, 'data parallel vs one replica')
  H.close(l3, l1, 2e-4, '--shard parameters vs one replica')
  H.check(l1[8] < l1[1], 'and they learn')
  H.check(two:find('replica 0 of 2', 1, true), 'the strategy is printed:\n' .. two)
  H.eq(select(2, two:gsub('\nstep 1/8', '')), 1, 'only replica 0 prints')
  H.eq(select(2, zero3:gsub('sample %(', '')), 1, 'only replica 0 prints the sample')
end)

H.test('--device cuda (emulated) prints the CPU losses', function()
  local args = quick .. '--steps 6 --every 1 --batch 4 --sample 0'
  local cpu, rc1 = run('', args)
  local gpu, rc2 = run('', args .. ' --device cuda', 'EMBER_CUDA_EMULATE=1:512')
  H.eq({ rc1, rc2 }, { 0, 0 }, cpu .. gpu)
  H.eq(#losses(gpu), 6, 'six losses:\n' .. gpu)
  H.close(losses(gpu), losses(cpu), 1e-4, 'emulated GPU vs CPU')
end)

H.test('bad options are clear errors', function()
  local function fails(args, ...)
    local out, rc = run('', args)
    H.check(rc ~= 0, 'exits non-zero: ' .. args)
    for i = 1, select('#', ...) do
      local s = select(i, ...)
      H.check(out:find(s, 1, true), ('%q in:\n%s'):format(s, out), 2)
    end
  end
  fails('--dim 10 --heads 4', '--dim 10', '--heads 4')
  fails('--bogus 1', 'unknown argument --bogus')
  fails('--steps x', '--steps', 'number')
  fails('--file /nonexistent/text', '--file', '/nonexistent/text')
  fails(quick .. '--steps 1 --prompt ~~~', '--prompt', '"~"')
  fails('--shard everything', '--shard must be')
end)

G.cleanup()
H.done()
