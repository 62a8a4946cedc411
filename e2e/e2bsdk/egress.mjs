// den's e2e test of an E2B create's network settings, enforced: run by
// e2e/e2b_egress_test.go (TestE2BEgress) inside the daemon's network
// namespace, with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set to
// the daemon's --e2b-listen address and a den token, and DEN_E2B_HOST_A
// and DEN_E2B_HOST_B to two test servers' addresses (port 80) in the
// test's "wan" namespace, DEN_E2B_HOST_C to a third server outside
// DEN_E2B_DENY (a CIDR holding A and B). The daemon runs with TAP networking, where
// den's egress policy is enforced (nftables).
//
// Makes three sandboxes (allowInternetAccess: false; allowOut [B] with
// denyOut [ALL_TRAFFIC]; denyOut [DENY] with allowOut [B], den's deny
// list with an exception) and checks from inside each which server a
// TCP connection reaches; a denyOut den cannot enforce (a domain) is
// refused at create; the policy holds after pause and connect, and in a
// fork. Leaves the sandboxes running and
// prints their ids on a last line, RESULT {json}, for the Go test to read
// den's own view of them (den net log) before it removes them. Every
// request path names the sandbox, so the servers' logs say who got
// through. Exits non-zero on the first failed check.
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, ALL_TRAFFIC } from 'e2b'

const template = process.env.DEN_E2B_TEMPLATE || 'debian'
const hostA = process.env.DEN_E2B_HOST_A
const hostB = process.env.DEN_E2B_HOST_B
const hostC = process.env.DEN_E2B_HOST_C
const deny = process.env.DEN_E2B_DENY
assert.ok(hostA && hostB && hostC && deny, 'DEN_E2B_HOST_A, _B, _C and DEN_E2B_DENY are required')
const t0 = Date.now()
const step = (what) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)}s] ${what}`)

// fetch asks for http://ADDR/SANDBOX/TAG from inside sbx with bash's
// /dev/tcp (the debian image has no wget or curl), giving up after secs
// (a dropped SYN only times out): {ok, out}, out the whole response.
async function fetch(sbx, addr, tag, secs) {
  const req = `GET /${sbx.sandboxId}/${tag} HTTP/1.0\\r\\nHost: ${addr}\\r\\n\\r\\n`
  const cmd = `timeout ${secs} bash -c 'exec 3<>/dev/tcp/${addr}/80 && printf "${req}" >&3 && cat <&3'`
  try {
    const r = await sbx.commands.run(cmd, { timeoutMs: (secs + 30) * 1000 })
    return { ok: true, out: r.stdout }
  } catch (e) {
    if (e instanceof CommandExitError) return { ok: false, out: `exit ${e.exitCode}: ${e.stderr}` }
    throw e
  }
}

// reaches says sbx got the server's answer from addr.
async function reaches(sbx, addr, tag, what) {
  const r = await fetch(sbx, addr, tag, 30)
  assert.ok(r.ok, `${what}: ${addr} not reached: ${r.out}`)
  assert.ok(/^HTTP\/1\.[01] 200 /.test(r.out) && r.out.endsWith(`\r\n\r\nthis is ${addr}\n`),
    `${what}: the answer from ${addr}: ${JSON.stringify(r.out)}`)
}

// blocked says sbx's connection to addr did not get through within 6 s.
async function blocked(sbx, addr, tag, what) {
  const r = await fetch(sbx, addr, tag, 6)
  assert.ok(!r.ok, `${what}: reached ${addr}, its policy does not hold: ${JSON.stringify(r.out)}`)
  step(`${what}: ${addr} blocked (${r.out.trim()})`)
}

// A denyOut den cannot enforce is refused, not ignored: a domain (its
// addresses are reached without it; E2B takes none there either).
let refused = null
try {
  const s = await Sandbox.create(template, { timeoutMs: 600_000, network: { denyOut: ['example.org'] } })
  await s.kill()
} catch (e) {
  refused = e
}
assert.ok(refused, 'a create with denyOut [example.org] was not refused')
assert.match(refused.message, /a deny list takes IPv4 addresses and CIDRs/, `the refusal: ${refused.message}`)
step(`denyOut [example.org] refused: ${refused.message}`)

step(`create three sandboxes from ${template}`)
const opts = { timeoutMs: 600_000, metadata: { suite: 'den-e2e-egress' } }
const [closed, listed, denied] = await Promise.all([
  Sandbox.create(template, { ...opts, allowInternetAccess: false }),
  Sandbox.create(template, { ...opts, network: { allowOut: [hostB], denyOut: [ALL_TRAFFIC] } }),
  Sandbox.create(template, { ...opts, network: { denyOut: [deny], allowOut: [hostB] } }),
])
step(`created: closed ${closed.sandboxId}, listed ${listed.sandboxId}, denied ${denied.sandboxId}`)

// denyOut [DENY] with allowOut [B]: C (not listed) and B (allowOut wins
// over denyOut) answer, so the network works and the blocks below are
// the policy's; A (in DENY) does not.
await reaches(denied, hostC, 'denied', `denyOut [${deny}]`)
await reaches(denied, hostB, 'denied', `denyOut [${deny}], allowOut [B]`)
step(`denyOut [${deny}], allowOut [B]: C and B reached`)
await blocked(denied, hostA, 'denied', `denyOut [${deny}]`)

// allowInternetAccess: false: neither server, and commands still run.
await blocked(closed, hostA, 'closed', 'allowInternetAccess false')
await blocked(closed, hostB, 'closed', 'allowInternetAccess false')
const r = await closed.commands.run('echo still here')
assert.equal(r.stdout, 'still here\n')

// allowOut [B], denyOut everything else: B, not A.
await reaches(listed, hostB, 'listed', 'allowOut [B]')
step('allowOut [B]: B reached')
await blocked(listed, hostA, 'listed', 'allowOut [B]')

// The policy holds after the sandbox is paused and resumed (den sleep
// and wake: a new VMM on the same TAP), and in a fork.
await closed.pause()
const again = await Sandbox.connect(closed.sandboxId, { timeoutMs: 600_000 })
await blocked(again, hostA, 'closed-resumed', 'allowInternetAccess false, resumed')

// A fork keeps its source's policy: B, not A.
const forks = await listed.fork({ count: 1, timeoutMs: 600_000 })
assert.equal(forks.length, 1)
const forked = forks[0]
assert.ok(!(forked instanceof Error), `fork: ${forked?.message}`)
await reaches(forked, hostB, 'forked', 'a fork of allowOut [B]')
step('a fork of allowOut [B]: B reached')
await blocked(forked, hostA, 'forked', 'a fork of allowOut [B]')

console.log('RESULT ' + JSON.stringify({
  closed: closed.sandboxId, listed: listed.sandboxId, denied: denied.sandboxId, forked: forked.sandboxId,
}))
