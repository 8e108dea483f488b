// The official openai client against quill serve: node openai_client.mjs BASE_URL API_KEY
// Prints one JSON object with what each call returned; tests/test_server_openai.c checks it.
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const out = {};
const messages = [{ role: "user", content: "Tell me a story" }];

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const chat = await client.chat.completions.create({ model: out.models[0], messages, max_tokens: 24, temperature: 0 });
out.chat = { content: chat.choices[0].message.content, finish_reason: chat.choices[0].finish_reason, usage: chat.usage };

const stream = await client.chat.completions.create({
  model: out.models[0], messages, max_tokens: 24, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
let text = "", role = null, finish = null, usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  const c = chunk.choices[0];
  if (!c) continue;
  if (c.delta.role) role = c.delta.role;
  if (c.delta.content) text += c.delta.content;
  if (c.finish_reason) finish = c.finish_reason;
}
out.stream = { content: text, role, finish_reason: finish, usage };

const completion = await client.completions.create({
  model: out.models[0], prompt: "Once upon a time", max_tokens: 16, temperature: 0,
});
out.completion = { text: completion.choices[0].text, finish_reason: completion.choices[0].finish_reason };

try {
  const bad = new OpenAI({ baseURL, apiKey: "wrong-" + apiKey, maxRetries: 0 });
  await bad.chat.completions.create({ model: out.models[0], messages, max_tokens: 2 });
  out.auth = { status: 200 };
} catch (e) {
  out.auth = { status: e.status, name: e.constructor.name, type: e.error?.type ?? null };
}
console.log(JSON.stringify(out));
