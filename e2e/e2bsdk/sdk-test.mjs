// den's e2e test of its E2B-compatible API: the official e2b SDK, as an
// E2B program uses it, against a real den daemon and real guests. Run by
// e2e/e2b_test.go with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set
// to the daemon's --e2b-listen address and a den token, and
// DEN_E2B_OTHER_KEY to another user's token. Exits non-zero on the
// first failed check.
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import http from 'node:http'
import {
  Sandbox, CommandExitError, AuthenticationError, SandboxNotFoundError, SandboxError, NotFoundError,
} from 'e2b'

const template = process.env.DEN_E2B_TEMPLATE || 'debian'
const other = process.env.DEN_E2B_OTHER_KEY
const t0 = Date.now()
// A create or fork boots or restores a TCG guest: on a loaded 2-core
// host it may take longer than the SDK's default request timeout.
const slow = 300_000
const step = (what) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)}s] ${what}`)

async function rejects(p, check, what) {
  try {
    await p
  } catch (e) {
    assert.ok(check(e), `${what}: unexpected error ${e?.constructor?.name}: ${e?.message}`)
    return e
  }
  assert.fail(`${what}: no error`)
}

// GET path through the E2B address with Host set to host (what
// sandbox.getHost gives: PORT-ID.localhost:PORT, which browsers and curl
// resolve to loopback, Node not).
function getVia(host, path, headers = {}) {
  const base = new URL(process.env.E2B_API_URL)
  return new Promise((resolve, reject) => {
    const req = http.request({ host: base.hostname, port: base.port, path, headers: { Host: host, ...headers }, timeout: 60_000 }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('timeout', () => req.destroy(new Error(`GET ${host}${path}: no answer in 60 s`)))
    req.on('error', reject)
    req.end()
  })
}

// A unary Connect call of envd, as the SDKs make them (JSON).
async function envdCall(sandboxId, method, body) {
  const res = await fetch(`${process.env.E2B_SANDBOX_URL}/filesystem.Filesystem/${method}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1', 'E2b-Sandbox-Id': sandboxId,
      'E2b-Sandbox-Port': '49983', 'X-Access-Token': process.env.E2B_API_KEY },
    body: JSON.stringify(body),
  })
  return { status: res.status, body: await res.json() }
}

// The sandbox's E2B logs (v2).
async function logsOf(sandboxId) {
  const res = await fetch(`${process.env.E2B_API_URL}/v2/sandboxes/${sandboxId}/logs`, { headers: { 'X-API-KEY': process.env.E2B_API_KEY } })
  assert.equal(res.status, 200)
  return (await res.json()).logs.map((l) => l.message)
}

// Bounded wait for cond (async), polling.
async function until(within, cond, what) {
  const end = Date.now() + within
  for (;;) {
    if (await cond()) return
    if (Date.now() > end) assert.fail(`${what}: not within ${within} ms`)
    await new Promise((r) => setTimeout(r, 250))
  }
}

step(`create from template ${template}`)
const sbx = await Sandbox.create(template, {
  timeoutMs: 600_000, requestTimeoutMs: slow, metadata: { suite: 'den-e2e', run: String(t0) }, envs: { GREETING: 'hello' },
})
step(`created ${sbx.sandboxId}`)

// commands.run: output, environment, exit codes.
let r = await sbx.commands.run('echo "$GREETING from $(hostname)"; echo to-err >&2')
assert.equal(r.exitCode, 0)
assert.equal(r.stdout, `hello from ${sbx.sandboxId}\n`)
assert.equal(r.stderr, 'to-err\n')
r = await sbx.commands.run('pwd; echo $FOO', { cwd: '/tmp', envs: { FOO: 'bar' } })
assert.equal(r.stdout, '/tmp\nbar\n')
const exitErr = await rejects(sbx.commands.run('echo partial; exit 3'), (e) => e instanceof CommandExitError, 'exit 3')
assert.equal(exitErr.exitCode, 3)
assert.equal(exitErr.stdout, 'partial\n')
step('run: output, env, cwd, exit codes')

// Streaming: output arrives as it is written, in pieces.
const chunks = []
r = await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.3; done', { onStdout: (d) => chunks.push(d) })
assert.equal(chunks.join(''), 'line1\nline2\nline3\n')
assert.ok(chunks.length >= 2, `streamed in ${chunks.length} piece(s)`)
step(`streaming: ${chunks.length} pieces`)

// stdin: input sent to a running process, then closed.
let h = await sbx.commands.run('cat', { background: true, stdin: true })
await sbx.commands.sendStdin(h.pid, 'through stdin\n')
await sbx.commands.closeStdin(h.pid)
r = await h.wait()
assert.equal(r.stdout, 'through stdin\n')
step('stdin')

// A terminal: input, output, resize.
const ptyOut = []
const term = await sbx.pty.create({ cols: 100, rows: 30, onData: (d) => ptyOut.push(Buffer.from(d).toString()) })
await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo pty-$((6*7))\n'))
await until(15_000, async () => ptyOut.join('').includes('pty-42'), `pty output (${JSON.stringify(ptyOut.join(''))})`)
await sbx.pty.resize(term.pid, { cols: 120, rows: 40 })
await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; exit\n'))
r = await term.wait()
assert.equal(r.exitCode, 0)
assert.match(ptyOut.join(''), /40 120/)
step('pty')

// A background process: its pid is the guest's, list shows it, connect
// follows it, kill ends it.
h = await sbx.commands.run('echo started; sleep 600', { background: true })
r = await sbx.commands.run(`tr '\\0' ' ' < /proc/${h.pid}/cmdline`)
assert.match(r.stdout, /sleep 600/)
let procs = await sbx.commands.list()
assert.ok(procs.some((p) => p.pid === h.pid && p.cmd === '/bin/bash'), `list: ${JSON.stringify(procs)}`)
const again = await sbx.commands.connect(h.pid)
assert.equal(await sbx.commands.kill(h.pid), true)
await rejects(again.wait(), (e) => e instanceof CommandExitError, 'wait on a killed process')
await until(10_000, async () => !(await sbx.commands.list()).some((p) => p.pid === h.pid), 'the killed process leaves the list')
assert.equal(await sbx.commands.kill(h.pid), false)
step('background, list, connect, kill')

// Files: write, read, list, stat, make dir, rename, remove.
await sbx.files.write('/root/work/a.txt', 'alpha')
assert.equal(await sbx.files.read('/root/work/a.txt'), 'alpha')
await sbx.files.write('rel.txt', 'relative')
assert.equal((await sbx.commands.run('cat /root/rel.txt')).stdout, 'relative')
await sbx.files.write([{ path: '/root/work/sub/b.txt', data: 'beta' }, { path: '/root/work/c.txt', data: 'gamma' }])
let entries = await sbx.files.list('/root/work')
assert.deepEqual(entries.map((e) => e.name).sort(), ['a.txt', 'c.txt', 'sub'])
assert.equal(entries.find((e) => e.name === 'sub').type, 'dir')
assert.equal(entries.find((e) => e.name === 'a.txt').type, 'file')
entries = await sbx.files.list('/root/work', { depth: 2 })
assert.ok(entries.some((e) => e.path === '/root/work/sub/b.txt'), `depth 2: ${entries.map((e) => e.path)}`)
const info = await sbx.files.getInfo('/root/work/a.txt')
assert.equal(info.size, 5)
assert.equal(info.owner, 'root')
assert.equal(await sbx.files.exists('/root/work/nope'), false)
assert.equal(await sbx.files.makeDir('/root/work/new/deep'), true)
assert.equal(await sbx.files.makeDir('/root/work/new/deep'), false)
await sbx.files.rename('/root/work/a.txt', '/root/work/new/a.txt')
assert.equal(await sbx.files.read('/root/work/new/a.txt'), 'alpha')
await sbx.files.remove('/root/work/new')
assert.equal(await sbx.files.exists('/root/work/new'), false)
await rejects(sbx.files.read('/root/work/new/a.txt'), (e) => e instanceof NotFoundError || e instanceof SandboxError, 'read a removed file')
const blob = randomBytes(10 << 20)
await sbx.files.write('/root/blob.bin', blob)
const back = await sbx.files.read('/root/blob.bin', { format: 'bytes' })
const sha = (b) => createHash('sha256').update(b).digest('hex')
assert.equal(sha(back), sha(blob))
assert.equal((await sbx.commands.run('sha256sum /root/blob.bin')).stdout.split(' ')[0], sha(blob))
step('files (10 MiB up and down, by hash)')

// Metrics: a sample taken now, of the VM's CPUs, memory and disk.
const metrics = await sbx.getMetrics()
assert.equal(metrics.length, 1, JSON.stringify(metrics))
const m0 = metrics[0]
assert.ok(m0.cpuCount >= 1 && m0.memTotal > 0 && m0.diskTotal > 0 && m0.diskUsed > 0, JSON.stringify(m0))
assert.ok(m0.cpuUsedPct >= 0 && m0.cpuUsedPct <= 100 && m0.memUsed >= 0 && m0.memUsed <= m0.memTotal, JSON.stringify(m0))
assert.ok(Math.abs(m0.timestamp.getTime() - Date.now()) < 60_000, `metric time ${m0.timestamp}`)
step(`metrics: cpu ${m0.cpuUsedPct.toFixed(1)}% of ${m0.cpuCount}, memory ${m0.memUsed}/${m0.memTotal}`)

// Another guest user: commands in its home with its HOME, files made
// as it, relative paths from its home; an unknown user is refused.
await sbx.commands.run('useradd -m -s /bin/bash alice')
r = await sbx.commands.run('id -un; pwd; echo $HOME', { user: 'alice' })
assert.equal(r.stdout, 'alice\n/home/alice\n/home/alice\n')
r = await sbx.commands.run('pwd', { user: 'alice', cwd: '/tmp' })
assert.equal(r.stdout, '/tmp\n')
r = await sbx.commands.run('pwd', { cwd: 'work' })
assert.equal(r.stdout, '/root/work\n', 'a relative cwd starts at the home')
await rejects(sbx.commands.run('pwd', { cwd: 'no-such-dir' }), (e) => e instanceof CommandExitError, 'a missing relative cwd')
await sbx.files.write('notes/a.txt', 'hers', { user: 'alice' })
assert.equal(await sbx.files.read('notes/a.txt', { user: 'alice' }), 'hers')
await sbx.files.makeDir('made/deep', { user: 'alice' })
r = await sbx.commands.run('pwd', { user: 'alice', cwd: 'made/deep' })
assert.equal(r.stdout, '/home/alice/made/deep\n')
r = await sbx.commands.run('stat -c %U:%G /home/alice/notes /home/alice/notes/a.txt /home/alice/made /home/alice/made/deep')
assert.equal(r.stdout, 'alice:alice\n'.repeat(4))
assert.equal((await sbx.files.getInfo('/home/alice/notes/a.txt')).owner, 'alice')
r = await sbx.commands.run('touch /root/not-hers', { user: 'alice' }).catch((e) => e)
assert.ok(r instanceof CommandExitError && /Permission denied/.test(r.stderr), `alice writing /root: ${r.stderr}`)
const noUser = await rejects(sbx.commands.run('true', { user: 'nosuch' }), (e) => e instanceof CommandExitError, 'an unknown user')
assert.match(noUser.stderr, /no user nosuch/)
await rejects(sbx.files.write('x', 'y', { user: 'nosuch' }), (e) => /no user "nosuch"/.test(e.message), 'a file as an unknown user')
step('users')

// A port of the sandbox at getHost(port): proxied to it through den's
// agent channel.
const web = await sbx.commands.run('mkdir -p /tmp/www && echo hi-from-port > /tmp/www/index.html && cd /tmp/www && exec python3 -m http.server 8000', { background: true })
const host = sbx.getHost(8000)
assert.match(host, new RegExp(`^8000-${sbx.sandboxId}\\.localhost:[0-9]+$`))
await until(60_000, async () => (await getVia(host, '/index.html').catch(() => ({}))).body === 'hi-from-port\n', 'the port through getHost')
let got2 = await getVia(sbx.getHost(8001), '/')
assert.equal(got2.status, 502)
assert.match(got2.body, /nothing listens/)
got2 = await getVia(`8000-inosuchsandbox.${host.split('.').slice(1).join('.')}`, '/')
assert.equal(got2.status, 404)
await web.kill()
step(`getHost: ${host}`)

// The non-streaming watchers (CreateWatcher, GetWatcherEvents, RemoveWatcher).
await sbx.files.makeDir('/root/polled')
let wr = await envdCall(sbx.sandboxId, 'CreateWatcher', { path: '/root/polled' })
assert.equal(wr.status, 200, JSON.stringify(wr.body))
const watcherId = wr.body.watcherId
await sbx.files.write('/root/polled/p.txt', 'polled')
const polled = []
await until(15_000, async () => {
  const ev = await envdCall(sbx.sandboxId, 'GetWatcherEvents', { watcherId })
  assert.equal(ev.status, 200, JSON.stringify(ev.body))
  for (const e of ev.body.events || []) polled.push(`${e.type} ${e.name}`)
  return polled.includes('EVENT_TYPE_CREATE p.txt')
}, `a polled watcher's events (${polled})`)
assert.equal((await envdCall(sbx.sandboxId, 'RemoveWatcher', { watcherId })).status, 200)
assert.equal((await envdCall(sbx.sandboxId, 'GetWatcherEvents', { watcherId })).status, 404)
step('polled watcher')

// Watching a directory: writes, removes.
await sbx.files.makeDir('/root/watched')
const seen = []
const watch = await sbx.files.watchDir('/root/watched', (e) => seen.push(`${e.type} ${e.name}`), { recursive: true })
await sbx.files.write('/root/watched/w.txt', 'watched')
await until(15_000, async () => seen.includes('create w.txt') && seen.includes('write w.txt'), `create and write seen (${seen})`)
await sbx.commands.run('mkdir /root/watched/d && echo x > /root/watched/d/deep && rm /root/watched/w.txt')
await until(15_000, async () => seen.includes('remove w.txt') && seen.includes('create d/deep'), `remove and a deep create seen (${seen})`)
await watch.stop()
step('watchDir')

// Another user's token sees nothing of this sandbox.
if (other) {
  await rejects(Sandbox.getInfo(sbx.sandboxId, { apiKey: other }), (e) => e instanceof SandboxNotFoundError, "another user's getInfo")
  await rejects(Sandbox.getMetrics(sbx.sandboxId, { apiKey: other }), (e) => e instanceof SandboxNotFoundError, "another user's getMetrics")
  assert.equal(await Sandbox.kill(sbx.sandboxId, { apiKey: other }), false)
  const theirs = await Sandbox.list({ apiKey: other }).nextItems()
  assert.equal(theirs.length, 0)
}

// List with filters, timeout.
let listed = await Sandbox.list({ query: { metadata: { suite: 'den-e2e' } } }).nextItems()
assert.deepEqual(listed.map((s) => [s.sandboxId, s.state, s.templateId]), [[sbx.sandboxId, 'running', template]])
assert.equal(listed[0].metadata.run, String(t0))
listed = await Sandbox.list({ query: { metadata: { suite: 'other' } } }).nextItems()
assert.equal(listed.length, 0)
await sbx.setTimeout(900_000)
let got = await Sandbox.getInfo(sbx.sandboxId)
assert.ok(got.endAt.getTime() > Date.now() + 800_000, `endAt ${got.endAt}`)
step('list, getInfo, setTimeout')

// Pause (den sleep: memory kept), then connect (den wake): a file in
// /dev/shm (memory only) is still there, and a background process runs on.
await sbx.files.write('/dev/shm/kept', 'in memory')
// The beat is renamed into place: a reader never sees it half written.
const bg = await sbx.commands.run('while :; do date +%s%N > /dev/shm/beat.new && mv /dev/shm/beat.new /dev/shm/beat; echo beat; sleep 0.2; done', { background: true })
assert.equal(await sbx.pause({ requestTimeoutMs: slow }), true)
got = await Sandbox.getInfo(sbx.sandboxId)
assert.equal(got.state, 'paused')
assert.equal(await sbx.isRunning(), false)
assert.equal(await sbx.pause(), false)
listed = await Sandbox.list({ query: { state: ['paused'], metadata: { suite: 'den-e2e' } } }).nextItems()
assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
listed = await Sandbox.list({ query: { state: ['running'], metadata: { suite: 'den-e2e' } } }).nextItems()
assert.equal(listed.length, 0)
assert.deepEqual(await Sandbox.getMetrics(sbx.sandboxId), [], 'metrics of a paused sandbox')
// Made without autoResume: envd and its ports do not wake it.
await rejects(sbx.commands.run('true'), (e) => /is paused: Sandbox.connect resumes it/.test(e.message), 'a command in a paused sandbox')
await rejects(sbx.files.read('/dev/shm/kept'), (e) => /is paused/.test(e.message), 'a file of a paused sandbox')
assert.equal((await getVia(host, '/')).status, 409)
assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
step('paused')
const resumed = await Sandbox.connect(sbx.sandboxId, { requestTimeoutMs: slow })
assert.equal(await resumed.isRunning(), true)
assert.equal((await resumed.commands.run('cat /dev/shm/kept')).stdout, 'in memory')
// The background process: alive, beating (its output now dropped),
// listed, not connectable, and killed.
r = await resumed.commands.run(`kill -0 ${bg.pid} || { echo "process ${bg.pid} is gone"; exit 0; }
a=$(cat /dev/shm/beat); i=0
while [ $i -lt 50 ]; do sleep 0.2; b=$(cat /dev/shm/beat); [ "$a" != "$b" ] && { echo beating; exit 0; }; i=$((i+1)); done
echo "beat stuck at $a"`)
assert.equal(r.stdout, 'beating\n')
procs = await resumed.commands.list()
assert.ok(procs.some((p) => p.pid === bg.pid), `list after pause: ${JSON.stringify(procs)}`)
await rejects(resumed.commands.connect(bg.pid), (e) => /no longer follows/.test(e.message), 'connect to a process from before the pause')
assert.equal(await resumed.commands.kill(bg.pid), true)
await until(10_000, async () => !(await resumed.commands.list()).some((p) => p.pid === bg.pid), 'the killed process leaves the list')
step('connected: /dev/shm kept, a background process ran on')

// Fork with a count: each fork has the source's memory (the file in
// /dev/shm) and disk, and a hostname and address of its own.
const forks = await resumed.fork({ count: 4, timeoutMs: 300_000, requestTimeoutMs: slow })
assert.equal(forks.length, 4)
for (const f of forks) assert.ok(!(f instanceof Error), `fork: ${f?.message}`)
const ids = new Set([sbx.sandboxId])
for (const f of forks) {
  ids.add(f.sandboxId)
  r = await f.commands.run('hostname; cat /dev/shm/kept; cat /root/rel.txt; echo fork > /root/rel.txt')
  assert.equal(r.stdout, `${f.sandboxId}\nin memoryrelative`)
}
assert.equal(ids.size, 5)
assert.equal((await resumed.files.read('/root/rel.txt')), 'relative')
listed = await Sandbox.list({ query: { metadata: { suite: 'den-e2e' } } }).nextItems()
assert.equal(listed.length, 5)
for (const f of forks) await f.kill()
step('forked x4')

// Snapshots are den checkpoints; a sandbox made from one has its memory.
const snap = await resumed.createSnapshot({ name: 'den-e2e-snap' })
assert.match(snap.snapshotId, new RegExp(`^${resumed.sandboxId}@cp-[0-9]+$`))
const snaps = await Sandbox.listSnapshots({ sandboxId: resumed.sandboxId }).nextItems()
assert.ok(snaps.some((s) => s.snapshotId === snap.snapshotId && s.names.includes('den-e2e-snap')), JSON.stringify(snaps))
const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: 300_000, requestTimeoutMs: slow })
assert.equal((await fromSnap.commands.run('cat /dev/shm/kept')).stdout, 'in memory')
assert.equal((await Sandbox.getInfo(fromSnap.sandboxId)).templateId, snap.snapshotId)
await fromSnap.kill()
assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
step('snapshot, a sandbox from it, delete')

// A sandbox's logs: what den's E2B server did with it.
const logs = await logsOf(resumed.sandboxId)
for (const want of [/^made from /, /^process [0-9]+ started as alice: \/bin\/bash -l -c id -un/, /^process [0-9]+ ended: exit status 3/, /^paused/, /^resumed/, /^forked x4/]) {
  assert.ok(logs.some((l) => want.test(l)), `logs: no ${want} in ${JSON.stringify(logs)}`)
}
step(`logs: ${logs.length} entries`)

// Snapshots outlive their sandbox: killed, it is gone from E2B's sight
// but a sandbox can still be made from its snapshot; deleting the last
// one removes it.
const kept = await resumed.createSnapshot({ name: 'outlives' })

// Kill.
await resumed.kill()
await rejects(Sandbox.getInfo(sbx.sandboxId), (e) => e instanceof SandboxNotFoundError, 'getInfo of a killed sandbox')
assert.equal(await Sandbox.kill(sbx.sandboxId), false)
listed = await Sandbox.list({ query: { metadata: { suite: 'den-e2e' } } }).nextItems()
assert.equal(listed.length, 0)
await rejects(resumed.commands.run('true'), (e) => e instanceof SandboxNotFoundError || /not found/.test(e.message), 'a command in a killed sandbox')
const fromKept = await Sandbox.create(kept.snapshotId, { timeoutMs: 300_000, requestTimeoutMs: slow })
assert.equal((await fromKept.commands.run('cat /dev/shm/kept')).stdout, 'in memory')
await fromKept.kill()
assert.ok((await Sandbox.listSnapshots({ sandboxId: resumed.sandboxId }).nextItems()).some((s) => s.snapshotId === kept.snapshotId))
assert.equal(await Sandbox.deleteSnapshot(kept.snapshotId), true)
await rejects(Sandbox.create(kept.snapshotId), (e) => /not found/.test(e.message), 'a sandbox from a deleted snapshot')
step('killed; its snapshot outlived it')

// Errors as an E2B program sees them.
await rejects(Sandbox.create('no-such-template'), (e) => e instanceof SandboxError && /404/.test(e.message) && /den/.test(e.message), 'unknown template')
await rejects(Sandbox.create(template, { apiKey: 'den_wrong' }), (e) => e instanceof AuthenticationError, 'wrong key')
await rejects(Sandbox.connect('inosuchsandbox'), (e) => e instanceof SandboxNotFoundError, 'connect to an unknown sandbox')
step('errors')

// A timeout with onTimeout pause and autoResume, taking no public
// traffic: the sandbox goes to sleep by itself; a request to one of its
// ports with its traffic token (none without) brings it back, with its
// timeout again, and so does a file call.
const short = await Sandbox.create(process.env.DEN_E2B_SHORT_TEMPLATE || 'base', {
  requestTimeoutMs: slow, timeoutMs: 3_000, lifecycle: { onTimeout: 'pause', autoResume: true }, network: { allowPublicTraffic: false }, metadata: { suite: 'den-e2e' },
})
assert.ok(short.trafficAccessToken, 'a traffic access token')
got = await Sandbox.getInfo(short.sandboxId)
assert.deepEqual(got.lifecycle, { onTimeout: 'pause', autoResume: true })
step(`created ${short.sandboxId} (timeout 3 s, then pause; autoResume)`)
await until(60_000, async () => (await Sandbox.getInfo(short.sandboxId)).state === 'paused', 'paused at its timeout')
step('timed out: paused')
got2 = await getVia(short.getHost(8000), '/')
assert.equal(got2.status, 403, got2.body)
assert.equal((await Sandbox.getInfo(short.sandboxId)).state, 'paused')
got2 = await getVia(short.getHost(8000), '/', { 'e2b-traffic-access-token': short.trafficAccessToken })
assert.equal(got2.status, 502, got2.body)
assert.match(got2.body, /nothing listens/)
// (Its 3 s timeout runs again from the wake: it may be paused anew by now.)
const resumes = async () => (await logsOf(short.sandboxId)).filter((l) => /^reached while paused: resuming/.test(l)).length
assert.equal(await resumes(), 1)
await short.setTimeout(300_000)
await short.pause() // false when its timeout paused it already
assert.equal((await Sandbox.getInfo(short.sandboxId)).state, 'paused')
// (The default image has no bash for commands.run: a file call.)
await short.files.write('/tmp/awake', 'awake')
assert.equal(await short.files.read('/tmp/awake'), 'awake')
assert.equal(await resumes(), 2)
assert.equal((await Sandbox.getInfo(short.sandboxId)).state, 'running')
step('resumed by itself: a port, then a file call')
await Sandbox.kill(short.sandboxId)
step('done')
