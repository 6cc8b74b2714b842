import json, sys, tempfile, os
d = tempfile.mkdtemp()
open(os.path.join(d, "hs_tasks.py"), "w").write("def add(a, b):\n    return a + b\n")
sys.path.insert(0, d)
from redis import Redis
from rq import Queue, SimpleWorker
r = Redis(port=int(sys.argv[1]))
q, high = Queue("default", connection=r), Queue("high", connection=r)
jobs = [q.enqueue("hs_tasks.add", 2, 3), high.enqueue("hs_tasks.add", 10, 20), q.enqueue("hs_tasks.add", 1, 1)]
out = {"queued": [q.count, high.count], "queues": sorted(x.name for x in Queue.all(connection=r))}
w = SimpleWorker([high, q], connection=r)
out["worked"] = w.work(burst=True)
for j in jobs:
    j.refresh()
out["status"] = [j.get_status() for j in jobs]
out["results"] = [j.return_value() for j in jobs]
out["left"] = [q.count, high.count]
out["finished"] = sorted(len(x.finished_job_registry) for x in (q, high))
for j in jobs:
    j.delete()
print(json.dumps(out, sort_keys=True))
