// bullmq with its default prefix (`bull`), as an application written for one Redis runs
// it: a queue, a worker, queue events, a delayed and a prioritized job, a failing job
// retried, a flow (a parent and its children). Prints what it saw, one line a fact, so
// the run through heatshield can be compared with the run against one Redis.
//   node bullmq_default.js PORT QUEUE
'use strict';
const assert = require('assert');
const { Queue, Worker, QueueEvents, FlowProducer } = require('bullmq');

const port = Number(process.argv[2]);
const name = process.argv[3];
const connection = { host: '127.0.0.1', port, maxRetriesPerRequest: null };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const say = (s) => console.log(s);

(async () => {
  try {
    const queue = new Queue(name, { connection });
    const events = new QueueEvents(name, { connection });
    await events.waitUntilReady();
    const completed = [];
    events.on('completed', ({ jobId }) => completed.push(jobId));
    let attempts = 0;
    const worker = new Worker(
      name,
      async (job) => {
        if (job.name === 'flaky' && attempts++ === 0) throw new Error('first try fails');
        if (job.name === 'parent') {
          const kids = await job.getChildrenValues();
          return Object.values(kids).reduce((a, b) => a + b, 0);
        }
        return job.data.n * 2;
      },
      { connection },
    );
    const a = await queue.add('plain', { n: 1 });
    const b = await queue.add('later', { n: 2 }, { delay: 300 });
    const c = await queue.add('urgent', { n: 3 }, { priority: 1 });
    const d = await queue.add('flaky', { n: 4 }, { attempts: 2 });
    const flow = await new FlowProducer({ connection }).add({
      name: 'parent',
      queueName: name,
      children: [
        { name: 'kid', queueName: name, data: { n: 5 } },
        { name: 'kid', queueName: name, data: { n: 6 } },
      ],
    });
    say(`added ${[a, b, c, d].map((j) => j.name).join(' ')} and a flow of ${flow.children.length}`);
    for (let i = 0; i < 200 && completed.length < 7; i++) await sleep(50);
    say(`completed events ${completed.length}`);
    const values = [];
    for (const j of [a, b, c, d]) values.push((await queue.getJob(j.id)).returnvalue);
    say(`return values ${values.join(' ')}`);
    say(`parent ${(await queue.getJob(flow.job.id)).returnvalue}`);
    say(`attempts of the flaky job ${(await queue.getJob(d.id)).attemptsMade}`);
    const counts = await queue.getJobCounts('completed', 'failed', 'waiting', 'delayed', 'active');
    say(`counts ${JSON.stringify(counts)}`);
    const logs = await queue.getJobLogs(a.id);
    say(`logs ${logs.count}`);
    await worker.close();
    await events.close();
    await queue.obliterate({ force: true });
    say(`obliterated ${(await queue.getJobCounts('completed')).completed}`);
    await queue.close();
    process.exit(0);
  } catch (e) {
    console.log(`FAILED: ${e && e.stack ? e.stack : e}`);
    process.exit(1);
  }
})();
