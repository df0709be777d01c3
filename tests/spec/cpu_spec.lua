-- The CPU kernel sets from the outside (runtime/cpu/cpu.h, lua/shard/cpu.lua): `shard cpu`,
-- SHARD_CPU_ISA choosing the set for a whole run, and the errors for a set that is not one
-- or that this CPU cannot run, given before anything runs.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")
local BIN, quote, sh = support.BIN, support.quote, support.sh

local function shard_env(env, args) return sh(env .. " " .. quote(BIN) .. " " .. args) end

-- `shard cpu` under the environment's own SHARD_CPU_ISA (tests/run.sh sets one per pass).
local _, info = shard_env("", "cpu")
local runs = {}
for set in (info:match("runs: ([^\n]*)") or ""):gmatch("%S+") do runs[#runs + 1] = set end
local ORDER = { "avx512bf16", "avx512", "avx2", "generic" }

describe("shard cpu", function()
  it("names the CPU, the set in use and the sets it runs, best first, down to generic", function()
    local code, out = shard_env("SHARD_CPU_ISA=", "cpu")
    assert.equal(0, code)
    assert.is_truthy(out:match("^model: %S[^\n]*\nin use: %S+\nruns: [^\n]+\n$"), out)
    assert.equal(runs[1], out:match("in use: (%S+)"), "with SHARD_CPU_ISA empty the best set is in use")
    assert.equal("generic", runs[#runs])
    local first
    for i, set in ipairs(ORDER) do if set == runs[1] then first = i end end
    assert.is_truthy(first, out)
    for i = 1, #runs do assert.equal(ORDER[first + i - 1], runs[i], out) end
  end)

  it("uses the set SHARD_CPU_ISA names, in every set the CPU runs", function()
    for _, set in ipairs(runs) do
      local code, out = shard_env("SHARD_CPU_ISA=" .. set, "cpu")
      assert.equal(0, code, out)
      assert.equal(set, out:match("in use: (%S+)"), out)
    end
  end)

  it("refuses a name that is not a set, naming the choices, before running anything", function()
    local code, out, err = shard_env("SHARD_CPU_ISA=avx3", "run /nonexistent.lua")
    assert.equal(2, code)
    assert.equal("", out)
    assert.equal("shard: SHARD_CPU_ISA=avx3 is not a kernel set (generic, avx2, avx512, avx512bf16)\n", err)
  end)

  -- On CPUs that qemu's user mode emulates (cpuid included), whatever CPU runs the test: an
  -- AVX2-only Haswell and a pre-AVX Nehalem.
  local function emulated(cpu, env)
    return sh("QEMU_CPU=" .. cpu .. " " .. (env or "") .. " qemu-x86_64 " .. quote(BIN) .. " cpu")
  end

  it("picks avx2 on an AVX2-only CPU and generic on one without AVX, from cpuid", function()
    local code, out, err = emulated("Haswell")
    assert.equal(0, code, err)
    assert.is_truthy(out:find("in use: avx2\nruns: avx2 generic\n", 1, true), out)
    code, out, err = emulated("Nehalem")
    assert.equal(0, code, err)
    assert.is_truthy(out:find("in use: generic\nruns: generic\n", 1, true), out)
  end)

  it("refuses a set above the CPU's best, naming the CPU and its best", function()
    local code, out, err = emulated("Haswell", "SHARD_CPU_ISA=avx512")
    assert.equal(2, code, out)
    assert.is_truthy(err:find("shard: SHARD_CPU_ISA=avx512: this CPU (", 1, true), err)
    assert.is_truthy(err:find("runs at most avx2", 1, true), err)
    code, _, err = emulated("Nehalem", "SHARD_CPU_ISA=avx2")
    assert.equal(2, code)
    assert.is_truthy(err:find("runs at most generic", 1, true), err)
  end)

  it("is named at the top of a CPU training run", function()
    local code, out = shard_env("SHARD_CPU_ISA=generic", "run recipes/gpt_shakespeare_char.lua --demo --max_iters=0"
      .. " --n_layer=1 --n_head=1 --n_embd=16 --block_size=8 --batch_size=2 --eval_iters=1 --sample_tokens=0"
      .. " --out_dir=/tmp/shard_cpu_spec")
    assert.equal(0, code, out)
    assert.is_truthy(out:match("^cpu: [^\n]+, kernel set generic\n"), out)
  end)
end)
