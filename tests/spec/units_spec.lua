-- shard.units: one format per kind of quantity whatever its size (issue 31, item 8): every
-- output a person reads prints through it, so these are the formats of the progress line, the
-- estimate, the dry run, the trace summary, the sweep tables and the memory messages.
local units = require("shard.units")

describe("shard.units", function()
  it("prints bytes in the largest binary unit that leaves at least 1, to one decimal", function()
    local cases = {
      { 0, "0 B" }, { 64, "64 B" }, { 1023, "1023 B" }, { 1024, "1.0 KiB" }, { 1536, "1.5 KiB" },
      { 41.5 * 2 ^ 20, "41.5 MiB" }, { 760.2 * 2 ^ 20, "760.2 MiB" }, { 118526.6 * 2 ^ 20, "115.7 GiB" },
      { 24.4 * 2 ^ 30, "24.4 GiB" }, { 3 * 2 ^ 40, "3.0 TiB" },
      { 2 ^ 20 - 1, "1.0 MiB" },              -- 1023.999 KiB rounds to 1024.0: the next unit
      { 1023.94 * 2 ^ 20, "1023.9 MiB" }, { -1536, "-1.5 KiB" },
    }
    for _, c in ipairs(cases) do assert.equal(c[2], units.bytes(c[1])) end
  end)

  it("prints MiB and ms as bare numbers to one decimal for keys and columns that name the unit", function()
    assert.equal("39.5", units.mib(39.497 * 2 ^ 20))
    assert.equal("0.0", units.mib(0))
    assert.equal("118526.6", units.mib(118526.6 * 2 ^ 20))   -- never another unit
    assert.equal("60.1", units.ms(0.0601))
    assert.equal("0.0", units.ms(0))
    assert.equal("0.0", units.ms(-1e-9))                       -- no negative zero
    assert.equal("1306837.1", units.ms(1306.8371))
  end)

  it("prints a time in us, ms, s, min or h, so that the figure is at least 1", function()
    local cases = {
      { 0, "0 us" }, { 12e-6, "12 us" }, { 999e-6, "999 us" }, { 0.9996e-3, "1.0 ms" }, { 0.645e-3, "645 us" },
      { 0.0601, "60.1 ms" }, { 0.9999, "999.9 ms" }, { 0.99996, "1.00 s" }, { 6.3329, "6.33 s" }, { 59.996, "1.0 min" },
      { 1306.837, "21.8 min" }, { 7200, "2.0 h" },
    }
    for _, c in ipairs(cases) do assert.equal(c[2], units.time(c[1])) end
  end)

  it("prints counts whole with thousands separators, fractions as percentages", function()
    assert.equal("0", units.count(0))
    assert.equal("999", units.count(999.4))
    assert.equal("12,780", units.count(12780.4))
    assert.equal("6,182", units.count(6181.5856))
    assert.equal("85,375,872", units.count(85375872))
    assert.equal("-1,234,567", units.count(-1234567))
    assert.equal("42.3%", units.percent(0.4231))
    assert.equal("0.0%", units.percent(0))
    assert.equal("100.0%", units.percent(1))
  end)

  it("prints every learning rate in three significant digits, whatever its size", function()
    assert.equal("9.90e-06", units.lr(9.901e-06))
    assert.equal("1.00e-03", units.lr(0.001))
    assert.equal("5.05e-04", units.lr(5.050e-04))
    assert.equal("0.00e+00", units.lr(0))
  end)

  it("prints decimal-prefixed rates and amounts to one decimal", function()
    assert.equal("638.0 GFLOP", units.si(6.38e11, "FLOP"))
    assert.equal("92.4 TFLOP", units.si(92.4e12, "FLOP"))
    assert.equal("1.0 TFLOP/s", units.si(999.99e9, "FLOP/s"))   -- rounds up into the next prefix
    assert.equal("450.0 GB/s", units.si(450e9, "B/s"))
    assert.equal("12.0 FLOP", units.si(12, "FLOP"))
  end)

  it("prints fixed decimals, and counts with their noun", function()
    assert.equal("2.5012", units.fixed(2.50123, 4))
    assert.equal("0.000", units.fixed(-1e-9, 3))
    assert.equal("1 rank", units.plural(1, "rank"))
    assert.equal("4 ranks", units.plural(4, "rank"))
    assert.equal("2 copies", units.plural(2, "copy", "copies"))
  end)

  it("aligns a table's columns: the first to the left, the others to the right", function()
    local text = units.columns({
      { "device", "compute", "serial" },
      { "H100 SXM", "645 us", "3.96 ms" },
      { "this CPU (101.0 GFLOP/s sgemm)", "6.33 s", "21.8 min" },
    }, { indent = "  " })
    assert.equal(table.concat({
      "  device                          compute    serial",
      "  H100 SXM                         645 us   3.96 ms",
      "  this CPU (101.0 GFLOP/s sgemm)   6.33 s  21.8 min",
    }, "\n"), text)
    assert.equal("a   1\nbb  2", units.columns({ { "a", "1" }, { "bb", "2" } }, { align = { "l", "l" } }))
  end)

  it("reads back the figures it prints", function()
    assert.equal(12780, units.parse(units.count(12780)))
    assert.equal(-1234567, units.parse("-1,234,567"))
    assert.equal(0.423, units.parse(units.percent(0.423)))
    assert.equal(39.5, units.parse(units.mib(39.5 * 2 ^ 20)))
    assert.equal(5.05e-4, units.parse(units.lr(5.05e-4)))
    assert.equal(1e4, units.parse("1.000e+04"))
    assert.is_nil(units.parse("1,2"))          -- not a thousands-separated number
    assert.is_nil(units.parse("41.5 MiB"))
    assert.is_nil(units.parse("fast"))
  end)
end)
