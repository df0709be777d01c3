-- shard.argv: the one command-line parser of bin/shard's commands (launch, sweep, repl,
-- estimate --dry-run) and of shard.config's overrides, its grammar and its errors; then each
-- command's own parse over it, for the behaviours each parser had before it.
local argv = require("shard.argv")

-- The usage message argv.parse raises for args under spec (fails if it raises none).
local function usage(args, spec)
  local ok, err = pcall(argv.parse, args, spec)
  assert.is_false(ok, "parsed without an error")
  assert.is_table(err)
  assert.is_string(err.usage)
  return err.usage
end

local SPEC = {
  options = {
    { "nproc", "count", min = 1, aliases = { "nproc-per-node" } },
    { "node-rank", "count", default = 0 },
    { "timeout", "seconds" },
    { "lr", "number" },
    { "hosts", "string", aliases = { "-H" }, key = "hosts_arg" },
    { "map-by", "choice", oneof = { "slot", "node" } },
    { "all", "flag", default = false },
  },
}

describe("shard.argv", function()
  it("takes --key=value, --key value, --flag and --no-flag, typed by kind", function()
    local o, pos = argv.parse({ "--nproc=2", "--timeout", "1.5", "--lr", "-3e-4", "--all", "--map-by", "node", "x" }, SPEC)
    assert.same({ nproc = 2, timeout = 1.5, lr = -3e-4, all = true, map_by = "node", node_rank = 0 }, o)
    assert.same({ "x" }, pos)
    o = argv.parse({ "--all", "--no-all" }, SPEC)
    assert.is_false(o.all)
    o = argv.parse({ "--all=false" }, SPEC)
    assert.is_false(o.all)
    o = argv.parse({ "--all=true" }, SPEC)
    assert.is_true(o.all)
  end)

  it("keeps defaults, the last of a repeated option, and positionals in order wherever they are", function()
    local o, pos = argv.parse({ "a", "--nproc", "2", "b", "--nproc=3", "c" }, SPEC)
    assert.same({ nproc = 3, node_rank = 0, all = false }, o)
    assert.same({ "a", "b", "c" }, pos)
  end)

  it("takes '-' and '_' alike in names, aliases, and stores under the declared key", function()
    local o = argv.parse({ "--node_rank=1", "--nproc_per_node", "4", "-H", "a:2,b:2", "--map_by=slot" }, SPEC)
    assert.same({ node_rank = 1, nproc = 4, hosts_arg = "a:2,b:2", map_by = "slot", all = false }, o)
    o = argv.parse({ "--hosts=c" }, SPEC)
    assert.equal("c", o.hosts_arg)
  end)

  it("takes a flag's following argument as a positional, and a value's whatever it looks like", function()
    local o, pos = argv.parse({ "--all", "file.lua" }, SPEC)
    assert.is_true(o.all)
    assert.same({ "file.lua" }, pos)
    o = argv.parse({ "--hosts", "--all" }, SPEC)
    assert.equal("--all", o.hosts_arg)
    assert.is_false(o.all)
  end)

  it("ends the options at --: what follows is positional", function()
    local o, pos = argv.parse({ "--all", "--", "--nproc=2", "-x" }, SPEC)
    assert.same({ node_rank = 0, all = true }, o)
    assert.same({ "--nproc=2", "-x" }, pos)
  end)

  it("with stop, hands the first positional and everything after it over untouched", function()
    local spec = { options = SPEC.options, stop = true }
    local o, pos = argv.parse({ "--nproc", "2", "recipe.lua", "--nproc=9", "--lr=x", "--bogus", "y" }, spec)
    assert.equal(2, o.nproc)
    assert.same({ "recipe.lua", "--nproc=9", "--lr=x", "--bogus", "y" }, pos)
    o, pos = argv.parse({ "--", "--odd.lua", "--all" }, spec)
    assert.same({ "--odd.lua", "--all" }, pos)
    assert.is_false(o.all)
  end)

  it("names an unknown option as written, with the known ones", function()
    assert.equal("unknown option --wrold=4 (known: --nproc, --node-rank, --timeout, --lr, --hosts, --map-by, --all)",
                 usage({ "--wrold=4" }, SPEC))
    assert.matches("^unknown option %-x ", usage({ "-x" }, SPEC))
    assert.matches("^unknown option %-%-no%-lr ", usage({ "--no-lr" }, SPEC))   -- --no- only for a flag
    local msg = usage({ "--bogus", "f.lua" }, { options = SPEC.options, stop = true, where = "before FILE" })
    assert.matches("^unknown option %-%-bogus before FILE %(known: ", msg)
  end)

  it("says which option lacks its value or has a bad one, and what it expects", function()
    assert.equal("--nproc needs a value", usage({ "--nproc" }, SPEC))
    assert.equal("--nproc expects a whole number >= 1, got '0'", usage({ "--nproc=0" }, SPEC))
    assert.equal("--nproc-per-node expects a whole number >= 1, got '1.5'", usage({ "--nproc-per-node", "1.5" }, SPEC))
    assert.equal("--node-rank expects a whole number, got '-1'", usage({ "--node-rank=-1" }, SPEC))
    assert.equal("--timeout expects a positive number of seconds, got '0'", usage({ "--timeout=0" }, SPEC))
    assert.equal("--lr expects a number, got 'fast'", usage({ "--lr", "fast" }, SPEC))
    assert.equal("--map-by expects slot or node, got 'row'", usage({ "--map-by=row" }, SPEC))
    assert.equal("--all expects true or false, got 'yes'", usage({ "--all=yes" }, SPEC))
    assert.equal("--no-all takes no value, got 'true'", usage({ "--no-all=true" }, SPEC))
  end)

  it("frames its messages with the command's prefix and suffix; --help and -h raise the help", function()
    local spec = { options = SPEC.options, prefix = "sweep: ", suffix = "\nusage: ..." }
    assert.equal("sweep: --nproc needs a value\nusage: ...", usage({ "--nproc" }, spec))
    for _, a in ipairs { "--help", "-h" } do
      local ok, err = pcall(argv.parse, { "--nproc=2", a }, { options = SPEC.options, help = "HELP TEXT" })
      assert.is_false(ok)
      assert.same({ help = "HELP TEXT" }, err)
    end
    assert.matches("^unknown option %-%-help", usage({ "--help" }, SPEC))   -- no help declared
  end)

  it("argv.try returns nil and the message instead of raising", function()
    local o, msg = argv.try({ "--nproc", "x" }, SPEC)
    assert.is_nil(o)
    assert.equal("--nproc expects a whole number >= 1, got 'x'", msg)
    local pos
    o, pos = argv.try({ "--nproc", "3", "f" }, SPEC)
    assert.equal(3, o.nproc)
    assert.same({ "f" }, pos)
  end)

  it("open (shard.config's overrides): every --key as text, bare --key as 'true', the rest stray", function()
    local o, stray = argv.parse({ "--lr=3e-4", "--n-layer=4", "--demo", "--a.b=x=y", "--empty=", "max_iters=5",
                                  "--steps", "7", "-v", "--", "--after" }, { open = true })
    assert.same({ lr = "3e-4", n_layer = "4", demo = "true", steps = "true", ["a.b"] = "x=y", empty = "" }, o)
    assert.same({ "max_iters=5", "7", "-v", "--after" }, stray)
  end)
end)

describe("the commands' parsers over shard.argv", function()
  it("shard.config: --no-flag sets a boolean default false; overrides type against the defaults", function()
    local config = require("shard.config")
    local saved = { config.overrides, config.stray, config.script }
    config.set_overrides(config.parse_args({ "--no-bias", "--lr=0.5", "--name=x" }))
    local cfg = config({ bias = true, lr = 1, name = "" })
    assert.same({ bias = false, lr = 0.5, name = "x" }, cfg)
    config.set_overrides(config.parse_args({ "--no-lr" }))
    local ok, err = pcall(config, { lr = 1 })
    assert.is_false(ok)
    assert.matches("unknown option --no_lr", err.usage, 1, true)
    config.set_overrides(config.parse_args({ "--lr", "2" }))
    ok, err = pcall(config, { lr = 1 })
    assert.is_false(ok)
    assert.matches("stray argument '2'", err.usage, 1, true)
    config.set_overrides(saved[1], saved[2], saved[3])
  end)

  it("shard launch: its flags in either spelling, FILE and the recipe's flags after it", function()
    local launch = require("shard.tools.launch")
    local o = launch.parse({ "--nproc", "2", "--node_rank=0", "--master-port", "29501", "--all", "--timeout=5",
                             "r.lua", "--lr=1", "--nproc=7" })
    assert.equal(2, o.nproc)
    assert.equal(29501, o.master_port)
    assert.equal("127.0.0.1", o.master_addr)
    assert.is_true(o.all)
    assert.equal(5, o.timeout)
    assert.equal("r.lua", o.file)
    assert.same({ "--lr=1", "--nproc=7" }, o.rest)
    local ok, err = pcall(launch.parse, { "--nproc", "2", "--bogus", "r.lua" })
    assert.is_false(ok)
    assert.matches("^unknown option %-%-bogus before FILE", err.usage)
    ok, err = pcall(launch.parse, { "r.lua" })
    assert.is_false(ok)
    assert.equal("--nproc N (N >= 1) is required", err.usage)
  end)

  it("shard sweep: one FILE anywhere among its flags, --out DIR or --out=DIR", function()
    local sweep = require("shard.tools.sweep")
    local o = sweep.parse_args({ "--retry-failed", "s.lua", "--out", "d", "--dry-run" })
    assert.same({ retry_failed = true, file = "s.lua", out = "d", dry_run = true }, o)
    local ok, err = pcall(sweep.parse_args, { "a.lua", "b.lua" })
    assert.is_false(ok)
    assert.matches("^sweep: one sweep file at a time, got a.lua and b.lua\nusage: shard sweep", err.usage)
    ok, err = pcall(sweep.parse_args, { "s.lua", "--out" })
    assert.is_false(ok)
    assert.matches("^sweep: %-%-out needs a value\nusage: shard sweep", err.usage)
    ok, err = pcall(sweep.parse_args, { "--retry" })
    assert.matches("^sweep: unknown option %-%-retry ", err.usage)
  end)

  it("shard repl: --nproc N, --timeout, help; anything else named", function()
    local repl = require("shard.tools.repl")
    assert.same({ nproc = 2, timeout = 3 }, repl.parse({ "--nproc=2", "--timeout", "3" }))
    assert.is_true(repl.parse({ "help" }).help)
    assert.is_true(repl.parse({ "-h" }).help)
    local o, err = repl.parse({ "--nproc", "0" })
    assert.is_nil(o)
    assert.equal("--nproc expects a whole number >= 1, got '0'", err)
    o, err = repl.parse({ "x" })
    assert.equal("unexpected argument 'x'", err)
    o, err = repl.parse({ "--timeout=3" })
    assert.equal("--timeout is for the ranks of --nproc N", err)
  end)
end)
