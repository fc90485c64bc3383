--[[
gpt_model.lua -- the model of examples/gpt.lua: a small GPT-style decoder built
from em.nn modules, loaded with dofile (the example, its tests and a planner
share it):

  local GPT = dofile('examples/gpt_model.lua')
  local model = GPT.build{ vocab = 65, layers = 2, dim = 64, heads = 4, context = 64 }
  local logits = model(ids)            -- ids: (B, T) int64, 1-based; logits (B, T, vocab)

Its top level is an nn.Sequential of

  GPTEmbedding   token ids (B, T) -> activations (B, T, dim): token + position
  GPTBlock x N   activations -> activations:
                   x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x))
  GPTHead        activations -> logits: final LayerNorm and a linear layer

so that whatever cuts a Sequential by its children (a pipeline's stages, a
sharded model's units) cuts it between whole blocks, and every cut carries one
activation tensor.

The head is not tied to the token embedding: tying would make the first and the
last child share a weight, which a pipeline puts on two different devices (its
gradient would then need a collective of its own between the two stages). The
price is vocab x dim more parameters, small at a character vocabulary.

Attention is written out from matmul and softmax: one Linear makes queries,
keys and values; scores q k^T / sqrt(head dim) get -inf above the diagonal
(position t sees positions 1..t only), softmax over the keys, a matmul with the
values, and a Linear projects the heads back. No dropout: a run is a function of
its seed alone.
]]
local em = require 'ember'
local nn = em.nn

local M = {}

-- -- Embedding: token ids -> activations --------------------------------------------------
local GPTEmbedding = nn.Module:extend('GPTEmbedding')
M.GPTEmbedding = GPTEmbedding

function GPTEmbedding:init(vocab, dim, context, o)
  self.context = context
  self.tok = nn.Embedding(vocab, dim, o)
  self.pos = nn.Embedding(context, dim, o)
end

function GPTEmbedding:forward(ids)
  if ids:dim() ~= 2 or ids:size(2) > self.context then
    error(('GPTEmbedding: expected token ids (batch, time) with time <= %d, got [%s]')
          :format(self.context, table.concat(ids.shape, ',')), 2)
  end
  local T = ids:size(2)
  local positions = em.arange(1, T + 1, { dtype = 'int64', device = ids.device })
  return self.tok(ids) + self.pos(positions)      -- (B, T, dim) + (T, dim)
end

-- -- Causal self-attention --------------------------------------------------------------------
local Attention = nn.Module:extend('CausalSelfAttention')
M.CausalSelfAttention = Attention

function Attention:init(dim, heads, o)
  if dim % heads ~= 0 then
    error(('CausalSelfAttention: dim %d is not a multiple of heads %d'):format(dim, heads), 2)
  end
  self.dim, self.heads = dim, heads
  self.qkv = nn.Linear(dim, 3 * dim, o and o.dtype and { dtype = o.dtype } or nil)
  self.proj = nn.Linear(dim, dim, o and o.dtype and { dtype = o.dtype } or nil)
end

-- keep[i][j] is true where query i may see key j (j <= i); (T, T), on device.
function M.causal_mask(T, device)
  local i = em.arange(1, T + 1, { dtype = 'int64', device = device }):view(T, 1)
  local j = em.arange(1, T + 1, { dtype = 'int64', device = device }):view(1, T)
  return j:le(i)
end

-- x: (B, T, dim) -> (B, T, dim)
function Attention:forward(x)
  local B, T, C = x:size(1), x:size(2), x:size(3)
  local H = self.heads
  local D = C / H
  local qkv = self.qkv(x)                                       -- (B, T, 3C)
  local function heads(k)                                       -- (B, H, T, D)
    return qkv:narrow(3, k * C + 1, C):reshape(B, T, H, D):transpose(2, 3)
  end
  local q, k, v = heads(0), heads(1), heads(2)
  local scores = em.matmul(q, k:transpose(3, 4)) * (1 / math.sqrt(D))   -- (B, H, T, T)
  scores = em.where(M.causal_mask(T, x.device), scores, -math.huge)
  local y = em.matmul(scores:softmax(4), v)                     -- (B, H, T, D)
  return self.proj(y:transpose(2, 3):reshape(B, T, C))
end

-- -- Block: activations -> activations -----------------------------------------------------------
local Block = nn.Module:extend('GPTBlock')
M.GPTBlock = Block

function Block:init(dim, heads, o)
  local lo = o and o.dtype and { dtype = o.dtype } or nil
  self.ln1 = nn.LayerNorm(dim, lo)
  self.attn = Attention(dim, heads, o)
  self.ln2 = nn.LayerNorm(dim, lo)
  self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim, lo), nn.GELU(), nn.Linear(4 * dim, dim, lo))
end

function Block:forward(x)
  x = x + self.attn(self.ln1(x))
  return x + self.mlp(self.ln2(x))
end

-- -- Head: activations -> logits ----------------------------------------------------------------
local Head = nn.Module:extend('GPTHead')
M.GPTHead = Head

function Head:init(dim, vocab, o)
  local lo = o and o.dtype and { dtype = o.dtype } or nil
  self.ln = nn.LayerNorm(dim, lo)
  self.out = nn.Linear(dim, vocab, lo)
end

function Head:forward(x) return self.out(self.ln(x)) end

-- -- The model ------------------------------------------------------------------------------------
-- cfg: {vocab, layers, dim, heads, context, dtype = 'float32'}
function M.build(cfg)
  for _, k in ipairs({ 'vocab', 'layers', 'dim', 'heads', 'context' }) do
    local v = cfg[k]
    if type(v) ~= 'number' or v < 1 or v % 1 ~= 0 then
      error(('gpt: %s must be a positive integer, got %s'):format(k, tostring(v)), 2)
    end
  end
  local o = { dtype = cfg.dtype or 'float32' }
  local children = { GPTEmbedding(cfg.vocab, cfg.dim, cfg.context, o) }
  for _ = 1, cfg.layers do children[#children + 1] = Block(cfg.dim, cfg.heads, o) end
  children[#children + 1] = Head(cfg.dim, cfg.vocab, o)
  local model = nn.Sequential(unpack(children))
  -- GPT-2's initialisation: N(0, 0.02) for every weight, zero biases, and the
  -- projections that write into the residual stream scaled by 1/sqrt(2 layers),
  -- so the stream's variance does not grow with depth.
  em.no_grad(function()
    for _, np in ipairs(model:named_parameters()) do
      local name, p = np[1], np[2]
      if not name:match('ln%d?%.[^.]+$') then              -- LayerNorms keep 1 and 0
        if name:match('%.bias$') then p:zero_()
        elseif name:match('attn%.proj%.weight$') or name:match('mlp%.3%.weight$') then
          p:normal_(0, 0.02 / math.sqrt(2 * cfg.layers))
        else p:normal_(0, 0.02) end
      end
    end
  end)
  return model
end

return M
