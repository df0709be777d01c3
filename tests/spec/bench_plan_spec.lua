-- make bench's argument handling, without running anything: BENCH_PLAN=1 sh bench/run.sh
-- prints the settings, the peers and the ISA variables it would use and exits. Nothing here
-- times, installs or imports PyTorch.
local support = dofile((os.getenv("SHARD_HOME") or ".") .. "/tests/spec/support.lua")

-- plan(vars): the plan's output and exit code under these variables (the knobs tested here are
-- cleared first, so the caller's environment cannot leak in)
local function plan(vars)
  return support.run("env -u ISA -u PEERS -u PEER_SPIN -u BENCH BENCH_PLAN=1 THREADS='1 2' " .. (vars or "") ..
                     " sh " .. support.quote(support.ROOT .. "/bench/run.sh"))
end

describe("make bench's plan", function()
  it("compares with every peer at each side's best ISA by default", function()
    local out, code = plan()
    assert.equal(0, code, out)
    assert.matches("peers: system venv compiled\n", out, 1, true)
    assert.matches("pytorch settings: 1 2 2s\n", out, 1, true)
    assert.matches("isa: best (each side its best)", out, 1, true)
  end)

  it("ISA=avx2 pins shard, OpenBLAS, ATen, MKL and oneDNN to AVX2", function()
    local out, code = plan("ISA=avx2")
    assert.equal(0, code, out)
    for _, kv in ipairs{ "SHARD_CPU_ISA=avx2", "OPENBLAS_CORETYPE=Haswell", "ATEN_CPU_CAPABILITY=avx2",
                         "MKL_ENABLE_INSTRUCTIONS=AVX2", "ONEDNN_MAX_CPU_ISA=AVX2", "DNNL_MAX_CPU_ISA=AVX2" } do
      assert.matches(" " .. kv, out, 1, true)
    end
  end)

  it("ISA=avx512 and ISA=generic map to their own sets", function()
    local out = plan("ISA=avx512")
    assert.matches("SHARD_CPU_ISA=avx512 OPENBLAS_CORETYPE=SkylakeX ATEN_CPU_CAPABILITY=avx512", out, 1, true)
    out = plan("ISA=generic")
    assert.matches("SHARD_CPU_ISA=generic OPENBLAS_CORETYPE=Prescott ATEN_CPU_CAPABILITY=default", out, 1, true)
  end)

  it("PEERS picks a subset in its own order, once each", function()
    local out, code = plan("PEERS='compiled system compiled'")
    assert.equal(0, code, out)
    assert.matches("peers: compiled system\n", out, 1, true)
  end)

  it("PEER_SPIN=0 drops the spinning setting", function()
    local out = plan("PEER_SPIN=0")
    assert.matches("pytorch settings: 1 2\n", out, 1, true)
  end)

  it("refuses an unknown ISA or peer, or no peer, with one line", function()
    local out, code = plan("ISA=sse2")
    assert.equal(1, code)
    assert.matches("ISA must be avx2, avx512 or generic", out, 1, true)
    out, code = plan("PEERS='system torch3'")
    assert.equal(1, code)
    assert.matches("PEERS takes system, venv and compiled, not 'torch3'", out, 1, true)
    out, code = plan("PEERS=' '")
    assert.equal(1, code)
    assert.matches("PEERS names no peer", out, 1, true)
  end)

  it("installs nothing", function()
    local dir = os.tmpname(); os.remove(dir)
    local out, code = plan("BENCH_VENV=" .. dir)
    assert.equal(0, code, out)
    assert.is_nil(io.open(dir .. "/bin/python"))
  end)
end)
