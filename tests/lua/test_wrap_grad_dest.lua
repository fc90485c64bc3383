--[[
test_wrap_grad_dest.lua -- under em.distribute's wrap, gradients are written
straight into the reducer's buckets (gradient destinations, core/autograd/
engine.c): no copy of a gradient per step (counted by em.copy_count()), the
averaged gradients the same bits as plain gradients averaged by hand (conv,
Linear, a Linear used twice, float64), a .grad kept from the step before is the
bucket view and holds the new gradient, and a .grad the user assigned is still
accumulated into and copied into the bucket (the one copy left). Run through
`ember --replicas N` with tests/lua/dist/grad_dest.lua.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local ember = arg[-1] or 'ember'
local L = dofile(dir .. 'dist/launch.lua')(dir, ember)

H.test('wrapped gradients land in the buckets uncopied, and are exact', function()
  for _, n in ipairs({ 2, 3 }) do
    local out, rc = L.replicas(n, 'grad_dest.lua')
    H.eq(rc, 0, out)
    local k = 0
    for r, d, c, kept, user, uc in out:gmatch('rank (%d+) maxdiff (%S+) copies (%d+) ' ..
        'kept_is_new (%a+) user_grad (%a+) user_copies (%d+)') do
      k = k + 1
      H.eq(tonumber(d), 0, ('%d replicas, replica %s: same bits as averaged by hand'):format(n, r))
      H.eq(tonumber(c), 0, 'no gradient copied in a wrapped step')
      H.eq(kept, 'true', "last step's .grad holds this step's gradient")
      H.eq(user, 'true', "a user's .grad: accumulated into, then averaged in the bucket")
      H.eq(tonumber(uc), 1, "the user's .grad is copied into its bucket, once")
    end
    H.eq(k, n)
  end
end)

H.done()
