// den bench --e2b's SDK side: the official e2b SDK, as an E2B program
// uses it, timed against a den daemon (E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY set to its --e2b-listen address and a den token). Each run
// prints one JSON line of milliseconds on stdout:
//   create_ms   Sandbox.create() to the first stdout of commands.run
//   created_ms  Sandbox.create() until it answers (the sandbox running)
//   pause_ms    sandbox.pause()
//   connect_ms  Sandbox.connect() of the paused sandbox to the first
//               stdout of commands.run
//   fork_ms     {"4": ms, "16": ms}: sandbox.fork({count}) until every
//               fork is answered
// DEN_E2B_BENCH_RUNS (default 1) and DEN_E2B_BENCH_FORKS (default
// "4,16"; "" for none) choose what runs. Every step has a deadline; on
// any failure the sandboxes made are killed and it exits non-zero.
import { Sandbox } from 'e2b'
import { performance } from 'node:perf_hooks'

const template = process.env.DEN_E2B_TEMPLATE || 'base'
const runs = Number(process.env.DEN_E2B_BENCH_RUNS || '1')
const forkCounts = (process.env.DEN_E2B_BENCH_FORKS ?? '4,16').split(',').filter(Boolean).map(Number)
const stepMs = 300_000 // each step's deadline
const opts = { timeoutMs: 900_000, requestTimeoutMs: stepMs }

// within: p, or an error once ms have passed.
function within(ms, p, what) {
  let timer
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms)
  })
  return Promise.race([p, late]).finally(() => clearTimeout(timer))
}

// firstOutput runs `echo ready` and resolves to when its first stdout
// arrived (performance.now()), once the command has ended.
async function firstOutput(sbx) {
  let first
  const r = await within(stepMs, sbx.commands.run('echo ready', {
    timeoutMs: stepMs, requestTimeoutMs: stepMs, onStdout: () => { first ??= performance.now() },
  }), 'commands.run')
  if (r.exitCode !== 0 || r.stdout !== 'ready\n' || first === undefined) {
    throw new Error(`commands.run: exit ${r.exitCode}, stdout ${JSON.stringify(r.stdout)}`)
  }
  return first
}

const made = new Set() // sandboxes to kill on the way out

async function killAll(ids) {
  await within(stepMs, Promise.all([...ids].map((id) => Sandbox.kill(id, opts).catch(() => false))), 'kill')
  for (const id of ids) made.delete(id)
}

async function run() {
  const out = { fork_ms: {} }
  let t = performance.now()
  const sbx = await within(stepMs, Sandbox.create(template, opts), 'Sandbox.create')
  out.created_ms = performance.now() - t
  made.add(sbx.sandboxId)
  out.create_ms = (await firstOutput(sbx)) - t

  t = performance.now()
  if (!(await within(stepMs, sbx.pause(opts), 'pause'))) throw new Error('pause: the sandbox was not running')
  out.pause_ms = performance.now() - t

  t = performance.now()
  const again = await within(stepMs, Sandbox.connect(sbx.sandboxId, opts), 'Sandbox.connect')
  out.connect_ms = (await firstOutput(again)) - t

  for (const count of forkCounts) {
    t = performance.now()
    const forks = await within(stepMs, again.fork({ ...opts, count }), `fork x${count}`)
    const took = performance.now() - t
    for (const f of forks) if (!(f instanceof Error)) made.add(f.sandboxId)
    const failed = forks.filter((f) => f instanceof Error)
    if (forks.length !== count || failed.length > 0) {
      throw new Error(`fork x${count}: ${forks.length} answers, ${failed.length} failed: ${failed[0]?.message}`)
    }
    out.fork_ms[count] = took
    await killAll(forks.map((f) => f.sandboxId))
  }
  await killAll([sbx.sandboxId])
  return out
}

try {
  for (let i = 0; i < runs; i++) console.log(JSON.stringify(await run()))
} catch (e) {
  const exit = e?.exitCode === undefined ? '' : ` (exit ${e.exitCode}, stderr ${JSON.stringify(e.stderr)})`
  console.error(`bench.mjs: ${e?.constructor?.name}: ${e?.message}${exit}`)
  await killAll(made).catch(() => {})
  process.exit(1)
}
