// The official clients of the agent APIs against quill serve:
//   node agents_client.mjs BASE_URL API_KEY
// (BASE_URL without /v1). Prints one JSON object with what each call returned or the error it
// threw; tests/test_server_agents.c checks it. Every call runs even when an earlier one fails.
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import Ajv from "ajv";

const [base, apiKey] = process.argv.slice(2);
const openai = new OpenAI({ baseURL: base + "/v1", apiKey, maxRetries: 0, timeout: 60000 });
const anthropic = new Anthropic({ baseURL: base, apiKey, maxRetries: 0, timeout: 60000 });
const out = {};

const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};
const history = [
  { role: "user", content: "What is the weather in Paris?" },
  { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }] },
  { role: "tool", tool_call_id: "call_1", content: "sunny, 21 C" },
];

async function attempt(name, fn) {
  try {
    out[name] = await fn();
  } catch (e) {
    out[name] = { error: { status: e.status ?? null, name: e.constructor.name, message: String(e.message).slice(0, 300) } };
  }
}

// chat.completions with tools and a tool-call history, whole and streamed (tool-call deltas joined
// by index as OpenAI's own stream helpers do)
await attempt("chat_tools", async () => {
  const r = await openai.chat.completions.create({ model: "m", messages: history, tools: [weather], max_tokens: 8, temperature: 0 });
  const c = r.choices[0];
  return { finish_reason: c.finish_reason, content: c.message.content, tool_calls: c.message.tool_calls ?? null };
});

await attempt("chat_tools_stream", async () => {
  const stream = await openai.chat.completions.create({
    model: "m", messages: history, tools: [weather], max_tokens: 8, temperature: 0, stream: true,
  });
  let content = "", finish = null;
  const calls = [];
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta.content) content += c.delta.content;
    for (const d of c.delta.tool_calls ?? []) {
      calls[d.index] ??= { id: null, name: "", arguments: "" };
      if (d.id) calls[d.index].id = d.id;
      if (d.function?.name) calls[d.index].name += d.function.name;
      if (d.function?.arguments) calls[d.index].arguments += d.function.arguments;
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { content, finish_reason: finish, tool_calls: calls };
});

// a tool_choice naming a function that is not offered: the client's BadRequestError
await attempt("chat_bad_tool_choice", async () => {
  await openai.chat.completions.create({
    model: "m", messages: history, tools: [weather], tool_choice: { type: "function", function: { name: "nope" } },
  });
  return { status: 200 };
});

// responses.create: text input, then a follow-up through previous_response_id, then a stream
await attempt("responses", async () => {
  const r = await openai.responses.create({ model: "m", input: "Say hello", instructions: "Be brief.", max_output_tokens: 8, temperature: 0, store: true });
  const follow = await openai.responses.create({ model: "m", previous_response_id: r.id, input: "Again", max_output_tokens: 4, temperature: 0 });
  return { id: r.id, status: r.status, output_text: r.output_text, output_types: r.output.map((o) => o.type),
           usage: r.usage, follow_status: follow.status, follow_input_tokens: follow.usage.input_tokens };
});

await attempt("responses_tools", async () => {
  const r = await openai.responses.create({
    model: "m", max_output_tokens: 8, temperature: 0,
    tools: [{ type: "function", name: "get_weather", parameters: weather.function.parameters }],
    input: [
      { role: "user", content: "What is the weather in Paris?" },
      { type: "function_call", call_id: "call_1", name: "get_weather", arguments: '{"city": "Paris"}' },
      { type: "function_call_output", call_id: "call_1", output: "sunny" },
    ],
  });
  return { status: r.status, output_types: r.output.map((o) => o.type), output_text: r.output_text };
});

await attempt("responses_stream", async () => {
  const stream = await openai.responses.create({ model: "m", input: "Say hello", max_output_tokens: 8, temperature: 0, stream: true });
  let text = "", types = [], final = null, seq_ok = true, last = -1;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.sequence_number !== last + 1) seq_ok = false;
    last = ev.sequence_number;
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.completed" || ev.type === "response.incomplete") final = ev.response;
  }
  return { text, first: types[0], last: types[types.length - 1], seq_ok, final_text: final?.output_text ?? null,
           final_output: final ? final.output.map((o) => o.type) : null };
});

// Anthropic: messages.create with tools and a tool_use/tool_result history, then streamed
const anthropicHistory = [
  { role: "user", content: "What is the weather in Paris?" },
  { role: "assistant", content: [{ type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } }] },
  { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "sunny, 21 C" }] },
];
const anthropicTools = [{ name: "get_weather", description: "The weather in a city", input_schema: weather.function.parameters }];

await attempt("messages", async () => {
  const r = await anthropic.messages.create({
    model: "m", max_tokens: 8, temperature: 0, system: "Be brief.", messages: anthropicHistory, tools: anthropicTools,
  });
  return { type: r.type, role: r.role, stop_reason: r.stop_reason, content: r.content, usage: r.usage };
});

await attempt("messages_stream", async () => {
  const stream = anthropic.messages.stream({
    model: "m", max_tokens: 8, temperature: 0, system: "Be brief.", messages: anthropicHistory, tools: anthropicTools,
  });
  let text = "";
  const events = [];
  stream.on("text", (t) => { text += t; });
  stream.on("streamEvent", (e) => events.push(e.type));
  const final = await stream.finalMessage();
  return { text, events, stop_reason: final.stop_reason, final_content: final.content, usage: final.usage };
});

await attempt("messages_auth", async () => {
  const bad = new Anthropic({ baseURL: base, apiKey: "wrong-" + apiKey, maxRetries: 0 });
  await bad.messages.create({ model: "m", max_tokens: 2, messages: [{ role: "user", content: "hi" }] });
  return { status: 200 };
});

// embeddings.create: a batch as floats (the client asks for base64 and decodes it) and as floats
await attempt("embeddings", async () => {
  const r = await openai.embeddings.create({ model: "m", input: ["hello world", "the weather in Paris"] });
  const f = await openai.embeddings.create({ model: "m", input: "hello world", encoding_format: "float" });
  const norm = (v) => Math.sqrt(v.reduce((a, x) => a + x * x, 0));
  return { count: r.data.length, dims: r.data[0].embedding.length, norms: r.data.map((d) => norm(d.embedding)),
           same_as_float: r.data[0].embedding.every((x, i) => Math.abs(x - f.data[0].embedding[i]) < 1e-6),
           differ: r.data[0].embedding.some((x, i) => x !== r.data[1].embedding[i]), usage: r.usage };
});

// tool_choice "required": a call by construction, its arguments valid against the tool's schema
// (checked with ajv), whole and streamed
const cityTool = {
  type: "function",
  function: {
    name: "get_weather", description: "The weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Rome"] } }, required: ["city"],
                  additionalProperties: false },
  },
};
const validate = new Ajv().compile(cityTool.function.parameters);
await attempt("chat_required", async () => {
  const req = { model: "m", messages: [{ role: "user", content: "Weather in Paris?" }], tools: [cityTool],
                tool_choice: "required", parallel_tool_calls: false, max_tokens: 300, temperature: 0 };
  const r = await openai.chat.completions.create(req);
  const c = r.choices[0], call = c.message.tool_calls?.[0];
  const stream = await openai.chat.completions.create({ ...req, stream: true });
  let name = "", args = "", finish = null;
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    for (const d of ch.delta.tool_calls ?? []) {
      if (d.function?.name) name += d.function.name;
      if (d.function?.arguments) args += d.function.arguments;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { finish_reason: c.finish_reason, name: call?.function.name ?? null, valid: call ? validate(JSON.parse(call.function.arguments)) : false,
           stream_same: name === call?.function.name && args === call?.function.arguments, stream_finish: finish };
});

// n: 2 choices in one request
await attempt("chat_n", async () => {
  const r = await openai.chat.completions.create({ model: "m", messages: [{ role: "user", content: "Hi" }], n: 2, max_tokens: 6, temperature: 1, seed: 3 });
  return { count: r.choices.length, indexes: r.choices.map((c) => c.index), differ: r.choices[0].message.content !== r.choices[1].message.content };
});

// Anthropic's tool_choice "any": a tool_use block, and Responses' "required": a function_call item
await attempt("messages_tool_use", async () => {
  const r = await anthropic.messages.create({
    model: "m", max_tokens: 300, temperature: 0, messages: [{ role: "user", content: "Weather in Paris?" }],
    tools: [{ name: "get_weather", input_schema: cityTool.function.parameters }], tool_choice: { type: "any", disable_parallel_tool_use: true },
  });
  const block = r.content.find((b) => b.type === "tool_use");
  return { stop_reason: r.stop_reason, name: block?.name ?? null, valid: block ? validate(block.input) : false };
});
await attempt("responses_call", async () => {
  const r = await openai.responses.create({
    model: "m", input: "Weather in Paris?", max_output_tokens: 300, temperature: 0, tool_choice: "required", parallel_tool_calls: false,
    tools: [{ type: "function", name: "get_weather", parameters: cityTool.function.parameters }],
  });
  const item = r.output.find((o) => o.type === "function_call");
  return { status: r.status, name: item?.name ?? null, valid: item ? validate(JSON.parse(item.arguments)) : false };
});

console.log(JSON.stringify(out));
