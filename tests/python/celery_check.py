"""A celery worker consuming two queues, and a task sent to each: their results read
back. Prints one line of JSON. Usage: celery_check.py PORT"""
import json, os, subprocess, sys, tempfile

port = sys.argv[1]
d = tempfile.mkdtemp()
with open(os.path.join(d, "hs_celery_app.py"), "w") as f:
    f.write(
        "import os\n"
        "from celery import Celery\n"
        "url = 'redis://127.0.0.1:%s/0' % os.environ['HS_PORT']\n"
        "app = Celery('hs', broker=url, backend=url)\n"
        "app.conf.broker_connection_retry_on_startup = True\n"
        "@app.task\n"
        "def add(a, b):\n"
        "    return a + b\n"
    )
os.environ["HS_PORT"] = port
env = dict(os.environ, PYTHONPATH=d)
log = open(os.path.join(d, "worker.log"), "w")
worker = subprocess.Popen(
    [sys.executable, "-m", "celery", "-A", "hs_celery_app", "worker", "-Q", "q1,q2", "--pool=solo",
     "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "warning"],
    env=env, cwd=d, stdout=log, stderr=subprocess.STDOUT,
)
sys.path.insert(0, d)
from hs_celery_app import add  # noqa: E402

out = {}
try:
    r1 = add.apply_async((2, 3), queue="q1")
    r2 = add.apply_async((10, 20), queue="q2")
    r3 = add.apply_async((1, 1), queue="q1", priority=5)
    out["results"] = [r.get(timeout=60) for r in (r1, r2, r3)]
    out["states"] = [r.state for r in (r1, r2, r3)]
finally:
    out["worker_alive"] = worker.poll() is None
    worker.terminate()
    worker.wait(30)
    if not out.get("results"):
        sys.stderr.write(open(os.path.join(d, "worker.log")).read())
print(json.dumps(out, sort_keys=True))
