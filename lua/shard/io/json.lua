-- shard.io.json: the small JSON subset (objects, arrays, strings with escapes, numbers,
-- true/false/null) of the two places lua-cjson cannot serve: a checkpoint's index (exact
-- doubles and integers for a bitwise resume: Debian's lua-cjson writes at most 14 significant
-- digits) and the full state dict's checksum metadata (sorted keys, so the same model gives the
-- same file's bytes: lua-cjson writes keys in hash order). Everything else reads and writes
-- JSON with lua-cjson (config.json, tokenizer.json, traces, metrics); safetensors headers are
-- parsed and built in C (runtime/io/safetensors.c).
local J = {}

local function fail(s, i, what) error(("json: %s at byte %d near '%s'"):format(what, i, s:sub(i, i + 10)), 0) end

local function skip(s, i) return s:find("[^ \t\r\n]", i) or #s + 1 end

local decode_value
local escapes = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

local function decode_string(s, i)
  local out, j = {}, i + 1
  while true do
    local c = s:sub(j, j)
    if c == "" then fail(s, i, "unterminated string") end
    if c == '"' then return table.concat(out), j + 1 end
    if c == "\\" then
      local e = s:sub(j + 1, j + 1)
      if e == "u" then
        local code = tonumber(s:sub(j + 2, j + 5), 16) or fail(s, j, "bad \\u escape")
        if code < 128 then out[#out + 1] = string.char(code)
        elseif code < 2048 then out[#out + 1] = string.char(192 + math.floor(code / 64), 128 + code % 64)
        else out[#out + 1] = string.char(224 + math.floor(code / 4096), 128 + math.floor(code / 64) % 64, 128 + code % 64) end
        j = j + 6
      else
        out[#out + 1] = escapes[e] or fail(s, j, "bad escape")
        j = j + 2
      end
    else
      out[#out + 1] = c
      j = j + 1
    end
  end
end

function decode_value(s, i)
  i = skip(s, i)
  local c = s:sub(i, i)
  if c == "{" then
    local obj = {}
    i = skip(s, i + 1)
    if s:sub(i, i) == "}" then return obj, i + 1 end
    while true do
      if s:sub(i, i) ~= '"' then fail(s, i, "expected a key") end
      local k
      k, i = decode_string(s, i)
      i = skip(s, i)
      if s:sub(i, i) ~= ":" then fail(s, i, "expected ':'") end
      obj[k], i = decode_value(s, i + 1)
      i = skip(s, i)
      local d = s:sub(i, i)
      if d == "}" then return obj, i + 1 end
      if d ~= "," then fail(s, i, "expected ',' or '}'") end
      i = skip(s, i + 1)
    end
  elseif c == "[" then
    local arr = {}
    i = skip(s, i + 1)
    if s:sub(i, i) == "]" then return arr, i + 1 end
    while true do
      arr[#arr + 1], i = decode_value(s, i)
      i = skip(s, i)
      local d = s:sub(i, i)
      if d == "]" then return arr, i + 1 end
      if d ~= "," then fail(s, i, "expected ',' or ']'") end
      i = i + 1
    end
  elseif c == '"' then
    return decode_string(s, i)
  elseif s:sub(i, i + 3) == "true" then return true, i + 4
  elseif s:sub(i, i + 4) == "false" then return false, i + 5
  elseif s:sub(i, i + 3) == "null" then return nil, i + 4
  end
  local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", i)
  if not num or num == "" then fail(s, i, "unexpected character") end
  return tonumber(num), i + #num
end

function J.decode(s)
  local v, i = decode_value(s, 1)
  if skip(s, i) <= #s then fail(s, i, "trailing characters") end
  return v
end

local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local e = ({ ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r" })[c]
    return e or ("\\u%04x"):format(c:byte())
  end) .. '"'
end

-- Encodes with sorted object keys, so the same table always gives the same text.
function J.encode(v)
  local t = type(v)
  if t == "string" then return encode_string(v) end
  if t == "number" then
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
    return ("%.17g"):format(v)
  end
  if t == "boolean" then return tostring(v) end
  if v == nil then return "null" end
  if t ~= "table" then error("json: cannot encode a " .. t, 2) end
  if #v > 0 or next(v) == nil then
    local parts = {}
    for i = 1, #v do parts[i] = J.encode(v[i]) end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for i, k in ipairs(keys) do parts[i] = encode_string(tostring(k)) .. ":" .. J.encode(v[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end

return J
