-- wrk script for bench/push.py: POST a Pub/Sub push envelope, a distinct message id per request.
--
-- Every request gets its own message id, RUN-THREAD-COUNTER, so none can be taken for a
-- redelivery of a message already decided (answered `duplicate`, a different code path).
--
-- Environment:
--   WRK_BODY_FILE  the envelope, with the placeholder @@ID@@ where the message id goes
--   WRK_PATH       the request path (e.g. /push/injury-report)
--   WRK_RUN        a prefix unique to this wrk run (ids never repeat across runs)
--
-- done() prints one line starting with WRK_JSON for bench/push.py to parse.

local threads = {}
local next_tid = 0

function setup(thread)
  thread:set("tid", next_tid)
  next_tid = next_tid + 1
  table.insert(threads, thread)
end

function init(args)
  local f = assert(io.open(assert(os.getenv("WRK_BODY_FILE"), "WRK_BODY_FILE is not set"), "rb"))
  local body = f:read("*a")
  f:close()
  local s, e = body:find("@@ID@@", 1, true)
  assert(s, "the body has no @@ID@@ placeholder")
  prefix = body:sub(1, s - 1)
  suffix = body:sub(e + 1)
  path = os.getenv("WRK_PATH") or "/"
  run = os.getenv("WRK_RUN") or "run"
  counter = 0
  headers = { ["Content-Type"] = "application/json" }
end

function request()
  counter = counter + 1
  return wrk.format("POST", path, headers, prefix .. run .. "-" .. tid .. "-" .. counter .. suffix)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"timeouts":%d,"non_2xx":%d,"latency_mean_us":%.1f,"latency_p50_us":%d,' ..
    '"latency_p90_us":%d,"latency_p99_us":%d,"latency_max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.timeout, e.status,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
