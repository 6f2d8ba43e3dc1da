-- wrk script for store.sh: POST {} to the URL's path with a random Idempotency-Key among
-- k0 .. k<N-1> (the keys storebench fill wrote).  wrk ... -s idemkey.lua URL -- N SEED
local n = 1
wrk.method = "POST"
wrk.body = "{}"

function init(args)
    n = tonumber(args[1]) or 1
    math.randomseed(tonumber(args[2]) or 1)
end

function request()
    return wrk.format(nil, nil, {
        ["Content-Type"] = "application/json",
        ["Idempotency-Key"] = "k" .. math.random(0, n - 1),
    })
end
