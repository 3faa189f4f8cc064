// A Node gateway process for the Python suite's tests (tests/test_node_gateway.py):
// the real Gateway on a test platform that appends every send to a file and can
// be told to SIGKILL its own process between the send and the ledger's mark.
//
//   node test/support/gateway-process.js '<config JSON>'
//
// Commands arrive on stdin as JSON lines ({"id": 1, "op": "start"}); each gets one
// answer line on stdout ({"id": 1, "ok": true, "result": ...}). Lines without an
// id are events ({"event": "callback", ...}: the agent was called).

import { closeSync, fsyncSync, openSync, writeSync } from 'node:fs';
import readline from 'node:readline';

import { DeliveryClient, Gateway, PlatformAdapter, SendFailed, SessionClient } from '../../src/index.js';

/**
 * @typedef {object} PlatformConfig
 * @property {string} name
 * @property {string} file Where sends are appended, one JSON line each.
 * @property {string} [mode] 'ok', 'die-after-send' (SIGKILL once the send is on file),
 *   'fail' (SendFailed, retryable, retry after 0.2 s), 'fail-once' (the first send fails
 *   so, later ones go out), 'reject' (not retryable).
 * @property {boolean} [connectFails] connect() throws.
 * @property {boolean} [idempotent] The platform drops a second send with the same key.
 * @property {boolean} [minimal] A plain object with name, connect and send only:
 *   the gateway's defaults stand in for the optional capabilities.
 */

/** @param {unknown} value */
function emit(value) {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

/**
 * @param {string} file
 * @param {Record<string, unknown>} record
 */
function appendDurably(file, record) {
  const fd = openSync(file, 'a');
  try {
    writeSync(fd, `${JSON.stringify(record)}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** The test platform: what it was sent is on file, so it survives a SIGKILL. */
class FilePlatform extends PlatformAdapter {
  /** @param {PlatformConfig} config */
  constructor(config) {
    super(config.name);
    this.config = config;
    this.idempotentSends = Boolean(config.idempotent);
    /** @type {Map<string, string>} */
    this.byKey = new Map();
    this.count = 0;
  }

  async connect() {
    if (this.config.connectFails) throw new Error(`${this.name} is down`);
  }

  /**
   * @param {string} chatId
   * @param {string} threadId
   * @param {string} text
   * @param {string} key
   */
  async send(chatId, threadId, text, key) {
    const failing = this.config.mode === 'fail' || this.config.mode === 'fail-once';
    if (this.config.mode === 'fail-once') this.config.mode = 'ok';
    if (failing) throw new SendFailed('503 from the test platform', { retryAfterS: 0.2 });
    if (this.config.mode === 'reject') throw new SendFailed('403: blocked by the user', { retryable: false });
    const known = this.idempotentSends && key ? this.byKey.get(key) : undefined;
    if (known) return known;
    this.count += 1;
    const messageId = `${this.name}-${process.pid}-${this.count}`;
    appendDurably(this.config.file, { pid: process.pid, chatId, threadId, text, key, messageId });
    this.byKey.set(key, messageId);
    // The message went out; the process dies before the ledger hears of it.
    if (this.config.mode === 'die-after-send') process.kill(process.pid, 'SIGKILL');
    return messageId;
  }
}

/**
 * @param {PlatformConfig} config
 * @returns {import('../../src/gateway.js').Adapter}
 */
function adapter(config) {
  const platform = new FilePlatform(config);
  if (!config.minimal) return platform;
  return {
    name: config.name,
    connect: () => platform.connect(),
    send: (chatId, threadId, text, key) => platform.send(chatId, threadId, text, key),
  };
}

/**
 * @param {string} kind 'echo' answers at once; 'hang' never answers (the turn stays mid-model);
 *   'fail-once' throws on its first call (the model is down), then answers.
 * @returns {(turn: import('../../src/gateway.js').Turn) => Promise<string>}
 */
function callback(kind) {
  let calls = 0;
  return async (turn) => {
    const inbox = turn.state.state.inbox;
    const last = inbox[inbox.length - 1]?.message.content ?? '';
    emit({ event: 'callback', sessionId: turn.session.sessionId, resumed: turn.inbound === null, last });
    calls += 1;
    if (kind === 'hang') await new Promise(() => {});
    if (kind === 'fail-once' && calls === 1) throw new Error('the model is down');
    return `answer to ${last}`;
  };
}

const config = JSON.parse(process.argv[2]);
const sessions = new SessionClient(config.sessionAddress);
const delivery = new DeliveryClient(config.deliveryAddress);
const gateway = new Gateway({
  name: config.name,
  agent: config.agent,
  sessions,
  delivery,
  adapters: config.platforms.map(adapter),
  callback: callback(config.callback ?? 'echo'),
  heartbeatMs: config.heartbeatMs ?? 200,
  claimEveryMs: config.claimEveryMs ?? 3_600_000,
  leaseTtlS: config.leaseTtlS ?? null,
  replyKey: config.replyKey ?? null,
  logger: {
    info: (message) => console.error(`info: ${message}`),
    warn: (message) => console.error(`warn: ${message}`),
    error: (message) => console.error(`error: ${message}`),
  },
});

/** @type {Record<string, (command: any) => Promise<unknown>>} */
const operations = {
  start: async () => {
    await gateway.start();
    return { instanceId: gateway.instanceId, connected: gateway.platforms() };
  },
  handle: async (command) => gateway.handle(command.inbound),
  recover: async () => gateway.recover(),
  deferred: async () => [...gateway.deferred],
  stop: async () => {
    await gateway.stop();
    sessions.close();
    delivery.close();
    setImmediate(() => process.exit(0));
    return null;
  },
};

readline.createInterface({ input: process.stdin }).on('line', (line) => {
  const command = JSON.parse(line);
  operations[command.op](command).then(
    (result) => emit({ id: command.id, ok: true, result }),
    (error) => emit({ id: command.id, ok: false, error: String(error?.stack ?? error) }),
  );
});
