// A short E2B program, as written for E2B, run by `make demo` against den
// (E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set to den's).
import { Sandbox } from 'e2b'

const sbx = await Sandbox.create('base', { timeoutMs: 120_000 })
console.log(`sandbox ${sbx.sandboxId} (a den VM)`)
const r = await sbx.commands.run('echo "hello from $(hostname)"; uname -sr', {
  onStdout: (d) => process.stdout.write(`  stdout: ${d}`),
})
console.log(`exit code ${r.exitCode}`)
await sbx.files.write('/root/from-e2b.txt', 'written through the E2B SDK\n')
console.log(`files: ${(await sbx.files.list('/root')).map((e) => e.name).join(' ')}`)
await sbx.pause()
console.log(`paused (den sleep): ${(await Sandbox.getInfo(sbx.sandboxId)).state}`)
const again = await Sandbox.connect(sbx.sandboxId)
console.log(`connected (den wake): ${(await again.files.read('/root/from-e2b.txt')).trim()}`)
await again.kill()
console.log('killed')
