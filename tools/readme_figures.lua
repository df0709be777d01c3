-- make readme-figures: reruns the commands behind README.md's figures and rewrites them, each
-- with its command, CPU and date (issue 31):
--   luajit tools/readme_figures.lua [--check] [NAME,...]
-- Each figure below names its commands and the part of README it writes (a table row, a
-- paragraph, a table or a code block's output lines, found by the text it starts with).
-- --check rewrites nothing: it reruns the figures that do not depend on the machine's speed
-- (bytes, memory peaks, FLOPs, losses) and names each one that README shows differently
-- (dates and wall seconds aside); exit 1 if any. Timed figures are only regenerated.
-- Runs from the project root with bin/shard built (or the binary $SHARD_BIN names); the
-- Shakespeare corpus where the recipes find it (SHARD_DATA, else ../shared/data). The
-- strategies sweep takes a minute or two.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path   -- shard's modules, from the root
local cjson = require("cjson")
local files = require("shard.files")

local README = "README.md"
local SWEEP_DIR = "recipes/sweeps/results"
local TIMELINE_PNG = "docs/img/memory_timeline_np4.png"

local sh_quote = files.shell_quote

-- The binary the commands run: $SHARD_BIN (as the tests take it), else bin/shard.
local BIN = os.getenv("SHARD_BIN") or (os.getenv("PWD") .. "/bin/shard")

-- Runs a command line (bin/shard in it: BIN); returns its stdout and stderr together, or
-- stops naming it.
local function run(cmd)
  io.stderr:write("  $ ", cmd, "\n")
  cmd = cmd:gsub("^bin/shard ", function() return sh_quote(BIN) .. " " end)
  local p = assert(io.popen(cmd .. " 2>&1; echo \"exit $?\""))
  local out = p:read("*a")
  p:close()
  local code = tonumber(out:match("exit (%d+)%s*$"))
  out = out:gsub("exit %d+%s*$", "")
  if code ~= 0 then error(("`%s` exited %d:\n%s"):format(cmd, code, out), 0) end
  return out
end

local function lines(text)
  local t = {}
  for l in (text .. "\n"):gmatch("(.-)\n") do t[#t + 1] = l end
  while #t > 0 and t[#t] == "" do t[#t] = nil end
  return t
end

local function read(path) return assert(files.read_file(path)) end

local TODAY = os.date("!%Y-%m-%d")
local CPU = (function()
  local info = run("bin/shard cpu")
  return ("%s, %s"):format(info:match("model: ([^\n]*)"), info:match("in use: ([^\n]*)"))
end)()

local UNITS = { B = 1, KiB = 2 ^ 10, MiB = 2 ^ 20, GiB = 2 ^ 30, TiB = 2 ^ 40 }

-- The bytes of the first "<number> <unit>" after pattern `after` in text (MiB, GiB ...).
local function bytes_after(text, after)
  local n, unit = text:match(after .. "%s*([%d.]+)%s*(%a+)")
  assert(n and UNITS[unit], ("no size after '%s' in:\n%s"):format(after, text))
  return tonumber(n) * UNITS[unit]
end

-- A whole number with thousands separated by commas, as README writes bytes.
local function thousands(n)
  local s = tostring(n)
  return (s:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^,", ""))
end

local function mib(b) return ("%.1f"):format(b / 2 ^ 20) end
local function gib(b) return ("%.1f"):format(b / 2 ^ 30) end

local function json_line(out, tag)
  local j = out:match(tag .. " (%b{})")
  assert(j, ("no `%s {json}` line in:\n%s"):format(tag, out))
  return cjson.decode(j)
end

-- The fields of a line of the sweep's table.csv (those read here hold no comma).
local function csv_fields(line)
  local t = {}
  for v in (line .. ","):gmatch("([^,]*),") do t[#t + 1] = v end
  return t
end

-- The region of one row of the Measured table: the line that starts with `start`, written
-- anew from its four cells.
local function row(start, what, cmd, cpu, result)
  return { { start = start, kind = "line", text = { ("| %s | %s | %s | %s |"):format(what, cmd, cpu, result) } } }
end

local OFFLOAD = "--data=/usr/share/common-licenses/GPL-3 --strategy=full_shard --n_layer=12 --n_head=12 --n_embd=768 --block_size=1024 --batch_size=8"
local OFFLOAD_ESTIMATE = "bin/shard estimate --model=gpt --vocab_size=76 --bias=false --n_layer=12 --n_head=12 --n_embd=768 --block_size=1024 --batch_size=1 --world=8 --measure=meta --offload"
local LLAMA = "--strategy=full_shard --n_layer=32 --n_head=32 --n_kv_head=8 --dim=4096 --ffn_dim=14336 --block_size=2048 --batch_size=64"
local PARITY = "--n_layer=4 --n_head=4 --n_embd=128 --block_size=64 --strategy=full_shard"
local RECIPE_CMD = "bin/shard run recipes/gpt_shakespeare_char.lua"
local MEMORY_ITERS = "--max_iters=10 --sample_tokens=0"
local TRACE_CMD = "bin/shard launch --nproc 4 recipes/gpt_shakespeare_char.lua --strategy=full_shard --max_iters=5 \\\n    --trace=out/trace.json --trace_steps=2:3 --memory_timeline=out/mem.png"
local PROGRESS_CMD = "bin/shard run recipes/gpt_shakespeare_char.lua --max_iters=100"

local function dry_run(recipe, args)
  local cmd = ("bin/shard estimate --dry-run --json --world=%s %s %s"):format(args.world, recipe, args.rest)
  return json_line(run(cmd), "dryrun")
end

-- The figures: name, whether check mode reruns it (deterministic), and make() -> the regions
-- of README it writes: { start = the text its first line starts with, kind = "line" |
-- "paragraph" | "table" | "block" (up to the code block's closing fence), text = new lines }.
local FIGURES = {
  { name = "offload_dryrun", deterministic = true, make = function()
      local cmd = "bin/shard estimate --dry-run --world=8 recipes/gpt_shakespeare_char.lua " .. OFFLOAD .. " --offload"
      local off = dry_run("recipes/gpt_shakespeare_char.lua", { world = 8, rest = OFFLOAD .. " --offload" })
      local on = dry_run("recipes/gpt_shakespeare_char.lua", { world = 8, rest = OFFLOAD })
      local est = run(OFFLOAD_ESTIMATE)
      local h = off.host_peak_by_tag
      local result = ("%.2f s; device peak %s MiB (%s without `--offload`), host %s MiB (param %s, grad %s, optim %s), %s MiB copied per step; the analytic `%s` on the same shapes: device %s MiB, host %s MiB (%s)"):format(
        off.seconds, mib(off.peak), mib(on.peak), mib(off.host_peak), mib(h.param), mib(h.grad), mib(h.optim),
        mib(off.copy_bytes), OFFLOAD_ESTIMATE, mib(bytes_after(est, "estimated device peak")),
        mib(bytes_after(est, "host memory")), TODAY)
      return row("| Dry run with CPU offload",
        "Dry run with CPU offload, GPT 85.8M (12 layers, n_embd 768, T 1024, batch 8), full_shard, world 8",
        "`" .. cmd .. "`", "—", result)
    end },
  { name = "llama_dryrun", deterministic = true, make = function()
      local cmd = "bin/shard estimate --dry-run --world=64 recipes/llama_shakespeare_char.lua " .. LLAMA
      local r = dry_run("recipes/llama_shakespeare_char.lua", { world = 64, rest = LLAMA })
      local text = run(cmd)
      local h100 = text:match("\n%s*H100[^\n]*")
      assert(h100, "no H100 row in:\n" .. text)
      local times = {}
      for v, unit in h100:gmatch("([%d.]+) (m?s)%f[%W]") do times[#times + 1] = tonumber(v) * (unit == "s" and 1000 or 1) end
      local result = ("%.2f s; rank 0 peak %s GiB (activations %s) in the %s; %.1f TFLOP per step per rank; estimate %.0f ms per step on H100/H200 (communication-bound, an upper bound), not a measurement (%s)"):format(
        r.seconds, gib(r.peak), gib(r.peak_by_tag.activation), r.at_peak, r.flops / 1e12, times[4], TODAY)
      return row("| Dry run of an 8B Llama",
        "Dry run of an 8B Llama (32 layers, 32 heads / 8 k/v, dim 4096, ffn 14336, T 2048, global batch 64, f32, char vocabulary) at world 64",
        "`" .. cmd .. "`", "—", result)
    end },
  { name = "dryrun_parity", deterministic = true, make = function()
      local cmd = "bin/shard launch --nproc N --all tests/mpi/dryrun_parity.lua " .. PARITY
      local peaks, comm = {}, {}
      for n = 1, 4 do
        local out = run(cmd:gsub(" N ", " " .. n .. " "))
        local dry, real, bytes = out:match("%[rank 0%][^\n]*peak dry (%d+), real (%d+) bytes[^\n]*; (%d+) bytes of collectives")
        assert(dry, "no rank 0 line in:\n" .. out)
        peaks[n] = ("%s / %s%s (%d)"):format(thousands(dry), thousands(real), n == 1 and " B" or "", n)
        comm[n] = thousands(bytes)
      end
      return row("| Dry run against real runs",
        "Dry run against real runs, the recipe model, full_shard, world 1-4", "`" .. cmd .. "`", "—",
        ("peak per rank dry / real: %s; collective bytes per step equal (%s) (%s)"):format(
          table.concat(peaks, ", "):gsub(" %(1%)", " (world 1)", 1), table.concat(comm, " / "), TODAY))
    end },
  { name = "recipe_loss", deterministic = true, make = function()
      local loss = {}
      for _, dtype in ipairs({ "f32", "bf16" }) do
        local out = run(RECIPE_CMD .. " --dtype=" .. dtype)
        local train, val = out:match(".*iter 2000 | train_loss ([%d.]+) | val_loss ([%d.]+)")
        assert(train, "no evaluation at iter 2000 in:\n" .. out)
        loss[dtype] = { train = train, val = val }
      end
      return row("| Shakespeare recipe, nanoGPT's CPU configuration",
        "Shakespeare recipe, nanoGPT's CPU configuration (nanoGPT: val 1.88)",
        "`" .. RECIPE_CMD .. "` (`--dtype=bf16` for bf16)", CPU,
        ("f32: val loss %s at iter 2000 (train %s); bf16: val %s (train %s), within the 0.02 of f32 that the bf16 path promises (%s)"):format(
          loss.f32.val, loss.f32.train, loss.bf16.val, loss.bf16.train, TODAY))
    end },
  { name = "recipe_memory", deterministic = true, make = function()
      local alloc, peak = {}, {}
      for _, n in ipairs({ 1, 2, 4 }) do
        local cmd = n == 1 and ("bin/shard run recipes/gpt_shakespeare_char.lua " .. MEMORY_ITERS)
          or ("bin/shard launch --nproc %d recipes/gpt_shakespeare_char.lua --strategy=full_shard %s"):format(n, MEMORY_ITERS)
        local line = run(cmd):match("memory %(rank 0%)[^\n]*")
        assert(line, "no `memory (rank 0)` line from " .. cmd)
        alloc[#alloc + 1], peak[#peak + 1] = mib(bytes_after(line, "allocated")), mib(bytes_after(line, "peak"))
      end
      return row("| Recipe model, rank 0 memory after training",
        "Recipe model, rank 0 memory after training (world 1 unwrapped, else full_shard)",
        ("`bin/shard launch --nproc N recipes/gpt_shakespeare_char.lua --strategy=full_shard %s` (world 1: `bin/shard run`)"):format(MEMORY_ITERS),
        "—", ("params + optimizer %s MiB, peak %s MiB at world 1 / 2 / 4 (the `memory (rank 0)` line; %s)"):format(
          table.concat(alloc, " / "), table.concat(peak, " / "), TODAY))
    end },
  { name = "sweep", deterministic = true, make = function(check)
      local dir = run("mktemp -d"):match("%S+")
      run(("bin/shard sweep recipes/sweeps/strategies.lua --out %s"):format(sh_quote(dir)))
      local csv = lines(read(dir .. "/table.csv"))
      local head, rows, losses, margins = {}, {}, {}, {}
      for i, name in ipairs(csv_fields(csv[1])) do head[name] = i end
      for i = 2, #csv do
        local c = csv_fields(csv[i])
        assert(c[head.status] == "ok", "a sweep point failed: " .. csv[i])
        local peak, est = tonumber(c[head.peak_bytes]), tonumber(c[head.estimate_bytes])
        rows[#rows + 1] = ("| %s | %s | %s | %s | %s |"):format(c[head.strategy], c[head.world], mib(peak), mib(est),
          mib(tonumber(c[head.comm_bytes_per_step])))
        losses[("%.3f"):format(tonumber(c[head.loss]))] = true
        margins[#margins + 1] = (est - peak) / 2 ^ 20
      end
      if not check then
        run(("cp %s/results.jsonl %s/table.md %s/table.csv %s/*.png %s/"):format(dir, dir, dir, dir, SWEEP_DIR))
      end
      run("rm -rf " .. sh_quote(dir))
      table.sort(margins)
      local loss = {}
      for l in pairs(losses) do loss[#loss + 1] = l end
      table.sort(loss)
      local table_lines = { "| strategy | world | peak per rank (MiB) | `shard estimate` (MiB) | bytes per step, one rank (MiB) |",
                            "|---|---:|---:|---:|---:|" }
      for _, r in ipairs(rows) do table_lines[#table_lines + 1] = r end
      return {
        { start = "The CPU strategies sweep (", kind = "paragraph", text = {
          ("The CPU strategies sweep (`SHARD_DATA=DIR bin/shard sweep recipes/sweeps/strategies.lua --out %s`,"):format(SWEEP_DIR),
          ("60 iterations, global batch 12; %s, %s; `make readme-figures` reruns it): every point"):format(CPU, TODAY),
          ("ends at %s (%s); the estimate is %.1f-%.1f MiB above the measured peak everywhere"):format(
            #loss == 1 and "the same loss" or "the losses", table.concat(loss, ", "), margins[1], margins[#margins]),
          "(`recipes/sweeps/results/`: `peak_memory.png`, `comm_bytes.png`). Tokens/s are in the results file;",
          "on a shared 2-core machine they vary from run to run. At world 1 the counters still count a sharded",
          "unit's copies as collectives. On one node the hybrid strategies are full_shard and shard_grad_op",
          "(one replica: no all-reduce across replicas)." } },
        { start = "| strategy | world | peak per rank", kind = "table", text = table_lines },
      }
    end },
  { name = "progress_line", make = function()
      local line = run(PROGRESS_CMD):match("\n(iter 50 | loss[^\n]*)")
      assert(line, "no progress line at iter 50 from " .. PROGRESS_CMD)
      return {
        { start = "The progress line of 100 steps", kind = "line", text = {
          ("The progress line of 100 steps (%s, %s; `make readme-figures` reruns it):"):format(CPU, TODAY) } },
        { start = "iter 50 | loss", kind = "line", text = { line } },
      }
    end },
  { name = "trace_summary", make = function()
      local dir = run("mktemp -d"):match("%S+")
      run(("mkdir -p %s/out && ln -s %s/recipes %s/recipes"):format(dir, sh_quote(os.getenv("PWD")), dir))
      local out = run(("cd %s && %s %s"):format(dir, sh_quote(BIN), TRACE_CMD:gsub("^bin/shard ", ""):gsub("\\\n", "")))
      run(("cp %s/out/mem.png %s && rm -rf %s"):format(dir, TIMELINE_PNG, dir))
      local summary = out:match("\n(trace summary over.-)\ntrace: ")
      assert(summary, "no trace summary in:\n" .. out)
      return {
        { start = "Its summary (4 ranks", kind = "line", text = {
          ("Its summary (4 ranks, full_shard, %s, on a shared 2-core machine, so the overlap is low and noisy; %s; `make readme-figures` reruns it, and the timeline below):"):format(CPU, TODAY) } },
        { start = "trace summary over", kind = "block", text = lines(summary) },
      }
    end },
}

-- The index range in src of a region (see FIGURES), or an error naming it.
local function find_region(src, region)
  local first
  for i, l in ipairs(src) do
    if l:sub(1, #region.start) == region.start then first = i; break end
  end
  assert(first, ("README.md has no line starting with '%s'"):format(region.start))
  local last = first
  local function more(l)
    if region.kind == "paragraph" then return l ~= "" end
    if region.kind == "table" then return l:sub(1, 1) == "|" end
    if region.kind == "block" then return not l:match("^```") end
    return false
  end
  while src[last + 1] and more(src[last + 1]) do last = last + 1 end
  return first, last
end

-- Dates and wall seconds aside, as check mode compares.
local function steady(text)
  return (text:gsub("%d%d%d%d%-%d%d%-%d%d", "DATE"):gsub("%d+%.%d+ s%f[^%w]", "T s"))
end

local function replace(src, region)
  local first, last = find_region(src, region)
  local old = table.concat({ unpack(src, first, last) }, "\n")
  local out = {}
  for i = 1, first - 1 do out[#out + 1] = src[i] end
  for _, l in ipairs(region.text) do out[#out + 1] = l end
  for i = last + 1, #src do out[#out + 1] = src[i] end
  return out, old, table.concat(region.text, "\n")
end

local function selected(wanted, name)
  if not wanted then return true end
  for w in wanted:gmatch("[^,]+") do
    if w == name then return true end
  end
  return false
end

-- Runs the selected figures; returns their regions, each with the figure's name.
local function regenerate(check, wanted)
  local regions = {}
  for _, fig in ipairs(FIGURES) do
    if selected(wanted, fig.name) and (fig.deterministic or not check) then
      io.stderr:write(fig.name, "\n")
      for _, region in ipairs(fig.make(check)) do
        region.figure = fig.name
        regions[#regions + 1] = region
      end
    end
  end
  return regions
end

local function main(args)
  local check, wanted = false, nil
  for _, a in ipairs(args) do
    if a == "--check" then check = true else wanted = a end
  end
  local regions = regenerate(check, wanted)
  -- README is read after the commands ran: an edit made meanwhile is kept
  local src, stale = lines(read(README)), {}
  for _, region in ipairs(regions) do
    local new, old, text = replace(src, region)
    if steady(old) ~= steady(text) then
      stale[#stale + 1] = ("%s: README shows\n%s\n  a run now gives\n%s"):format(region.figure, old, text)
    end
    if not check then src = new end
  end
  if not check then
    local f = assert(io.open(README, "wb"))
    f:write(table.concat(src, "\n"), "\n")
    f:close()
  end
  for _, s in ipairs(stale) do print((check and "stale " or "rewrote ") .. s) end
  print(("%d figure region(s) %s"):format(#stale, check and "stale" or "changed"))
  if check and #stale > 0 then os.exit(1) end
end

main(arg)
