'use strict';
// BullMQ's rate limiter (a Worker's `limiter: { max, duration }`) draining a backlog, measured
// as examples/bench_controls.rs measures redwheel's `rl`. Redis must listen on
// 127.0.0.1:$REDIS_PORT (default 6391); run-bullmq-limiter.sh starts a private one.
//
// usage: node bullmq_limiter.js [--reps 3] [--max 100] [--duration 1000] [--secs 30]
//                               [--backlog 5000] [--concurrency 4]
//
// Per rep (FLUSHALL first): `backlog` jobs are added with no delay (addBulk, batches of
// 1,000), then a Worker (in this process, `concurrency`, a no-op processor) with the limiter
// drains them for `secs`. A job's admission time is `job.processedOn` (set by the worker's
// moveToActive, the step its limiter lets through). Over the run (admissions from the first
// on, `secs` long): deliveries, the rate against max/duration, the most admissions in any
// sliding window of `duration` ms, and lateness against the ideal limited schedule
// (admission i at t0 + floor(i / max) * duration) p50/p99/max. One JSON line per rep.
const { Queue, Worker } = require('bullmq');
const IORedis = require('ioredis');

const args = process.argv.slice(2);
const arg = (name, def) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : def;
};
const REPS = arg('reps', 3);
const MAX = arg('max', 100);
const DURATION = arg('duration', 1000);
const SECS = arg('secs', 30);
const BACKLOG = arg('backlog', 5000);
const CONCURRENCY = arg('concurrency', 4);
const PORT = Number(process.env.REDIS_PORT || 6391);
const connection = { host: '127.0.0.1', port: PORT, maxRetriesPerRequest: null };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pct = (sorted, p) => sorted[Math.max(1, Math.ceil(p * sorted.length)) - 1];

async function rep(r) {
  const admin = new IORedis(connection);
  await admin.flushall();
  const queue = new Queue('limited', { connection });
  await queue.waitUntilReady();
  const payload = 'p'.repeat(64);
  for (let off = 0; off < BACKLOG; off += 1000) {
    const jobs = [];
    for (let i = off; i < Math.min(BACKLOG, off + 1000); i++) jobs.push({ name: 'j', data: { payload } });
    await queue.addBulk(jobs);
  }
  const admitted = [];
  const worker = new Worker(
    'limited',
    async (job) => {
      admitted.push(job.processedOn);
    },
    { connection, concurrency: CONCURRENCY, limiter: { max: MAX, duration: DURATION } },
  );
  await worker.waitUntilReady();
  await sleep(SECS * 1000 + 2000);
  await worker.close();
  await queue.close();
  await admin.quit();
  admitted.sort((a, b) => a - b);
  const t0 = admitted[0];
  const t = admitted.filter((x) => x < t0 + SECS * 1000);
  let maxInWindow = 0;
  for (let i = 0, j = 0; i < t.length; i++) {
    while (j < t.length && t[j] < t[i] + DURATION) j++;
    maxInWindow = Math.max(maxInWindow, j - i);
  }
  const late = t.map((x, i) => x - (t0 + Math.floor(i / MAX) * DURATION)).sort((a, b) => a - b);
  const rate = t.length / SECS;
  console.log(
    JSON.stringify({
      test: 'bullmq_rate_limited',
      rep: r,
      max: MAX,
      per_ms: DURATION,
      run_s: SECS,
      concurrency: CONCURRENCY,
      delivered: t.length,
      rate_per_s: Number(rate.toFixed(2)),
      rate_vs_limit: Number((rate / ((MAX * 1000) / DURATION)).toFixed(4)),
      max_in_any_window: maxInWindow,
      lateness_p50_ms: pct(late, 0.5),
      lateness_p99_ms: pct(late, 0.99),
      lateness_max_ms: late[late.length - 1],
    }),
  );
}

(async () => {
  for (let r = 0; r < REPS; r++) await rep(r);
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
