-- wrk script for groupcommit.sh: POST {} with a fresh Idempotency-Key on every request, so each
-- one is leased, forwarded and completed (no replays).  wrk -t1 ... -s freshkey.lua URL -- PREFIX
-- (one wrk thread: the counter is unique; PREFIX keeps runs on one store apart)
local prefix = "k"
local n = 0
wrk.method = "POST"
wrk.body = "{}"

function init(args)
    prefix = args[1] or prefix
end

function request()
    n = n + 1
    return wrk.format(nil, nil, {
        ["Content-Type"] = "application/json",
        ["Idempotency-Key"] = prefix .. "-" .. n,
    })
end
