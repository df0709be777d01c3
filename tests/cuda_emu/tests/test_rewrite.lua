-- test_rewrite.lua: rewrite.lua keeps line numbers, rewrites every launch and __shared__ form
-- the kernels use, and stops the build on a form it cannot handle.
-- Run: luajit tests/cuda_emu/tests/test_rewrite.lua  (prints "C test_rewrite: N passed, N failed")
local passed, failed = 0, 0
local function check(ok, what)
  if ok then passed = passed + 1 else failed = failed + 1; print("not ok " .. what) end
end

local tmp = os.tmpname()
local function rewrite(src)
  local f = assert(io.open(tmp .. ".cu", "wb")); f:write(src); f:close()
  local cmd = ("luajit tests/cuda_emu/rewrite.lua %s.cu %s.out case.cu 2>%s.err"):format(tmp, tmp, tmp)
  local ok = os.execute(cmd)
  ok = ok == true or ok == 0
  local out, err
  local g = io.open(tmp .. ".out", "rb"); if g then out = g:read("*a"); g:close() end
  local e = io.open(tmp .. ".err", "rb"); if e then err = e:read("*a"); e:close() end
  os.remove(tmp .. ".out")
  return ok, out, err
end
local function lines(s) local _, n = s:gsub("\n", ""); return n end

local cases = {
  { "k<<<g, b>>>(x, y);", "::emu::launch(k, \"k\", __FILE__, __LINE__, g, b)(x, y);" },
  { "k<T><<<g, b, 0, st>>>(x);", "::emu::launch(k<T>, \"k<T>\", __FILE__, __LINE__, g, b, 0, st)(x);" },
  { "ce<T, int64_t><<<(unsigned)n, 256, 0, st>>>(a);", "::emu::launch(ce<T, int64_t>, \"ce<T, int64_t>\", __FILE__, __LINE__, (unsigned)n, 256, 0, st)(a);" },
  { "k<<<dim3((unsigned)((r + 7) / 8), 1), 256, 0, st>>>(a);", "::emu::launch(k, \"k\", __FILE__, __LINE__, dim3((unsigned)((r + 7) / 8), 1), 256, 0, st)(a);" },
  { "ns::k <<< g , b >>> (a);", "::emu::launch(ns::k , \"ns::k\", __FILE__, __LINE__,  g , b ) (a);" },
  { "k<<<g,\n   b>>>(a,\n b);", "::emu::launch(k, \"k\", __FILE__, __LINE__, g,\n   b)(a,\n b);" },
  { "k<T>\n  <<<g, b>>>(a);", "::emu::launch(k<T>\n  , \"k<T>\", __FILE__, __LINE__, g, b)(a);" },
  { "/* k<<<g, b>>>(a) */ \"<<<\";", "/* k<<<g, b>>>(a) */ \"<<<\";" },
  { "{ __shared__ float s[32]; }", "{ float (&s)[32] = ::emu::shared_var<float[32], 0>([]{}); }" },
  { "{ __shared__ float a[32], b[4][8]; }", "{ float (&a)[32] = ::emu::shared_var<float[32], 0>([]{}), (&b)[4][8] = ::emu::shared_var<float[4][8], 0>([]{}); }" },
  { "{ __shared__ __align__(16) double d[2]; }", "{ double (&d)[2] = ::emu::shared_var<double[2], 16>([]{}); }" },
  { "{ __shared__ int *p, x; }", "{ int (*&p) = ::emu::shared_var<int *, 0>([]{}), (&x) = ::emu::shared_var<int, 0>([]{}); }" },
  { "{ extern __shared__ __align__(128) char smem[]; }", "{ char *smem = (char *)::emu::dynamic_shared(); }" },
  { "{ extern __shared__ float acc[];   /* c */ }", "{ float *acc = (float *)::emu::dynamic_shared();   /* c */ }" },
  { "{ __shared__ float s\n  [32]; }", "{ float (&s)[32] = ::emu::shared_var<float[32], 0>([]{})\n; }" },
}
for i, c in ipairs(cases) do
  local ok, out = rewrite(c[1])
  local want = '#line 1 "case.cu"\n' .. c[2]
  check(ok and out == want, ("case %d: %q -> %q, want %q"):format(i, c[1], tostring(out), want))
  check(ok and lines(out) == lines(c[1]) + 1, ("case %d keeps the line count"):format(i))
end

local bad = {
  { "k<<<g, b>>>;", "argument list" },
  { "<<<g, b>>>(a);", "kernel name" },
  { "k<<<g, (b>>>(a);", ">>>" },
  { "__shared__ float s[32];", "namespace scope" },
  { "{ __shared__ float s = 0; }", "initializer" },
  { "{ extern __shared__ float s[4]; }", "unsized" },
  { "{ __shared__ float s[32] }", "';'" },
}
for i, c in ipairs(bad) do
  local ok, _, err = rewrite(c[1])
  check(not ok and err and err:find(c[2], 1, true) and err:find("case.cu:1:", 1, true),
    ("bad case %d %q must stop the build mentioning %q, got %s"):format(i, c[1], c[2], tostring(err)))
end
os.remove(tmp .. ".cu"); os.remove(tmp .. ".err"); os.remove(tmp)
print(("C test_rewrite: %d passed, %d failed"):format(passed, failed))
os.exit(failed == 0 and 0 or 1)
