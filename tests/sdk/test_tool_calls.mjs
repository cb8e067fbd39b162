// The openai Node SDK's tool-calling flow against strata-server, whole and streamed: a request with
// tools gets tool_calls back, the tool's answer goes in as a tool message, and the final answer comes
// back as content. The model is a generated tiny one whose vocabulary holds the call's text in three
// user-defined tokens (strata-make-model --add-token); logit_bias with a repetition penalty makes
// greedy decoding write them in order, so the reply is a real tool call in Qwen3's syntax, parsed by
// the server. The SDK comes from tools/install-deps.sh (an npm install into .sdk/, pinned).
//
// Exit 77 (ctest: skipped) when the SDK is not installed. Prints "sdk: N passed, M failed".
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import path from 'node:path';

const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
for (const key of ['server', 'make-model', 'sdk-dir'])
  if (!args[key]) { console.error(`usage: test_tool_calls.mjs --server BIN --make-model BIN --sdk-dir DIR [--template FILE]`); process.exit(2); }

let OpenAI;
try {
  OpenAI = createRequire(path.join(path.resolve(args['sdk-dir']), 'index.js'))('openai').OpenAI;
} catch (e) {
  console.log(`sdk: skipped: the openai SDK is not installed in ${args['sdk-dir']} (tools/install-deps.sh installs it): ${e.message}`);
  process.exit(77);
}

// The call's text split in three tokens, and the final answer in one.
const CALL = ['<tool_call>\n{"name": "get_weather", ', '"arguments": {"city": ', '"Paris"}}\n</tool_call>'];
const ANSWER = 'It is sunny in Paris today.';
const TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

const dir = mkdtempSync(path.join(tmpdir(), 'strata-sdk-'));
let server = null;

function startServer(model) {
  const flags = ['-m', model, '--port', '0', '--ctx', '1024'];
  if (args.template && existsSync(args.template)) flags.push('--chat-template', args.template);
  server = spawn(args.server, flags, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`strata-server did not start in 60 s:\n${log}`)), 60000);
    const read = (chunk) => {
      log += chunk;
      const m = log.match(/Listening on (http:\/\/\S+) /);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    };
    server.stdout.on('data', read);
    server.stderr.on('data', read);
    server.on('exit', (code) => reject(new Error(`strata-server exited (${code}):\n${log}`)));
  });
}

async function waitReady(base) {
  for (let i = 0; i < 600; ++i) {
    try {
      if ((await fetch(`${base}/v1/models`)).status === 200) return;
    } catch { /* not listening yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('the model did not load in 60 s');
}

async function tokenId(base, text) {
  const r = await (await fetch(`${base}/tokenize`, { method: 'POST', body: JSON.stringify({ content: text }) })).json();
  assert.equal(r.tokens.length, 1, `"${text}" is one token: ${JSON.stringify(r.tokens)}`);
  return r.tokens[0];
}

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

let client, callBias, answerBias;
// Greedy with a repetition penalty over the whole history: each call token, once written, drops to a
// tenth, so the next one's lower bias wins; 30 apart is far above the tiny model's own logits.
const callParams = () => ({ model: 'tiny', tools: TOOLS, temperature: 0, max_tokens: 3, logit_bias: callBias,
                            repeat_penalty: 10, repeat_last_n: -1 });
const answerParams = () => ({ model: 'tiny', tools: TOOLS, temperature: 0, max_tokens: 1, logit_bias: answerBias });
const question = () => [{ role: 'user', content: 'What is the weather in Paris?' }];

function checkCall(message) {
  assert.equal(message.role, 'assistant');
  assert.equal(message.tool_calls?.length, 1, JSON.stringify(message));
  const call = message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
  assert.ok(call.id, 'the call has an id');
  assert.ok(!message.content, `no content beside the call: ${JSON.stringify(message.content)}`);
  return call;
}

function toolTurn(messages, assistant, call) {
  messages.push(assistant);
  messages.push({ role: 'tool', tool_call_id: call.id, content: JSON.stringify({ city: 'Paris', sky: 'sunny' }) });
}

test('whole replies: tools -> tool_calls -> tool message -> answer', async () => {
  const messages = question();
  const first = await client.chat.completions.create({ ...callParams(), messages });
  assert.equal(first.choices[0].finish_reason, 'tool_calls');
  const call = checkCall(first.choices[0].message);
  toolTurn(messages, first.choices[0].message, call);
  const second = await client.chat.completions.create({ ...answerParams(), messages });
  assert.equal(second.choices[0].message.content, ANSWER);
  assert.ok(!second.choices[0].message.tool_calls?.length);
  assert.notEqual(second.choices[0].finish_reason, 'tool_calls');
});

test('streamed replies: the SDK assembles the tool_calls deltas', async () => {
  const whole = await client.chat.completions.create({ ...callParams(), messages: question() });
  const messages = question();
  const stream = client.chat.completions.stream({ ...callParams(), messages });
  let deltas = 0, content = '', finish = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    deltas += choice.delta?.tool_calls?.length ?? 0;
    content += choice.delta?.content ?? '';
    finish = choice.finish_reason ?? finish;
  }
  const done = await stream.finalChatCompletion();
  assert.equal(finish, 'tool_calls');
  assert.ok(deltas >= 3, `the call came in pieces as it was written (${deltas} deltas)`);
  assert.equal(content, '', 'no call markup in the content deltas');
  const call = checkCall(done.choices[0].message);
  assert.deepEqual(done.choices[0].message.tool_calls, whole.choices[0].message.tool_calls);

  toolTurn(messages, done.choices[0].message, call);
  const answer = client.chat.completions.stream({ ...answerParams(), messages });
  const final = await answer.finalChatCompletion();
  assert.equal(final.choices[0].message.content, ANSWER);
  assert.ok(!final.choices[0].message.tool_calls?.length);
});

async function main() {
  const model = path.join(dir, 'tools.gguf');
  execFileSync(args['make-model'], ['--preset', 'tiny', '-o', model, ...CALL.flatMap((t) => ['--add-token', t]),
                                    '--add-token', ANSWER], { stdio: 'ignore' });
  const base = await startServer(model);
  await waitReady(base);
  const ids = [];
  for (const t of CALL) ids.push(await tokenId(base, t));
  callBias = { [ids[0]]: 100, [ids[1]]: 70, [ids[2]]: 40 };
  answerBias = { [await tokenId(base, ANSWER)]: 100 };
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });

  let passed = 0, failed = 0;
  for (const t of tests) {
    try {
      await t.fn();
      ++passed;
      console.log(`ok - ${t.name}`);
    } catch (e) {
      ++failed;
      console.log(`FAILED - ${t.name}\n${e.stack}`);
    }
  }
  console.log(`sdk: ${passed} passed, ${failed} failed`);
  return failed === 0 ? 0 : 1;
}

let code = 1;
try {
  code = await main();
} catch (e) {
  console.log(`sdk: setup failed: ${e.stack}`);
} finally {
  if (server) server.kill('SIGTERM');
  rmSync(dir, { recursive: true, force: true });
}
process.exit(code);
