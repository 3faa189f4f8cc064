// End-to-end: the Node clients against the real services (spawned here).

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, test } from 'node:test';

import {
  DEFAULT_DEADLINE_MS,
  DeliveryClient,
  SessionClient,
  SwitchboardError,
  routingKey,
} from '../src/index.js';
import { startServices } from './support/server.js';

/** @type {import('./support/server.js').RunningServices | undefined} */
let services;
/** @type {SessionClient} */
let sessions;
/** @type {DeliveryClient} */
let delivery;

before(async () => {
  services = await startServices();
  sessions = new SessionClient(services.sessionAddress);
  delivery = new DeliveryClient(services.deliveryAddress);
});

after(async () => {
  sessions?.close();
  delivery?.close();
  await services?.stop();
});

/**
 * Awaits a promise that must reject with a SwitchboardError, and returns it.
 * @param {Promise<unknown>} promise
 * @returns {Promise<SwitchboardError>}
 */
async function refusal(promise) {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof SwitchboardError, `not a SwitchboardError: ${error}`);
    return error;
  }
  assert.fail('the call succeeded');
}

describe('clients', () => {
  test('have a camelCase method for every RPC of the protos', () => {
    for (const client of [sessions, delivery]) {
      for (const rpc of client.rpcNames()) {
        const method = rpc[0].toLowerCase() + rpc.slice(1);
        const found = /** @type {Record<string, unknown>} */ (/** @type {unknown} */ (client))[method];
        assert.equal(typeof found, 'function', `${client.serviceName}.${method}`);
      }
    }
    assert.equal(sessions.deadlineMs, DEFAULT_DEADLINE_MS);
  });
});

describe('SessionService', () => {
  const agent = 'node-agent';

  test('create an agent, resolve a web session, append a message, read history, watch', async () => {
    const { agent: created } = await sessions.createAgent({
      agent: { name: agent, displayName: 'Node agent', memory: { tone: 'dry' } },
    });
    assert.equal(created.name, agent);
    assert.equal(created.displayName, 'Node agent');
    assert.deepEqual(created.memory, { tone: 'dry' });
    assert.equal(typeof created.version, 'string', 'uint64 comes back as a String');

    const source = { transport: 'web', conversationId: 'tab-1' };
    const first = await sessions.resolveSession({ agent, source });
    assert.equal(first.created, true);
    assert.equal(first.session.agent, agent);
    assert.equal(first.session.routingKey, `agent:${agent}:web:id=tab-1`);
    assert.equal(routingKey(agent, first.session.source), first.session.routingKey, 'built offline');
    assert.equal(first.session.status, 'SESSION_STATUS_OPEN');
    assert.equal(first.session.source.transport, 'web');
    const sessionId = first.session.sessionId;

    const again = await sessions.resolveSession({ agent, source });
    assert.equal(again.created, false);
    assert.equal(again.session.sessionId, sessionId);

    const appended = await sessions.appendEvents({
      agent,
      sessionId,
      expectedVersion: first.session.version,
      events: [
        { messageAppended: { message: { role: 'ROLE_USER', content: 'hello from node', sender: 'u1' } } },
      ],
    });
    assert.equal(appended.events.length, 1);
    assert.equal(appended.events[0].body, 'messageAppended', 'oneofs: the case is named');
    assert.equal(BigInt(appended.version), BigInt(first.session.version) + 1n);

    const { messages } = await sessions.getHistory({ agent, sessionId });
    assert.equal(messages.length, 1);
    assert.equal(messages[0].sequence, appended.events[0].sequence);
    assert.equal(messages[0].message.role, 'ROLE_USER');
    assert.equal(messages[0].message.content, 'hello from node');

    // The live stream replays from the start and ends quietly when the loop breaks.
    const seen = [];
    const stream = sessions.watchEvents({ afterSequence: '0', sessionId }, { timeoutMs: 5000 });
    for await (const { event } of stream) {
      seen.push(event.body);
      if (event.body === 'messageAppended') break;
    }
    assert.deepEqual(seen, ['sessionOpened', 'messageAppended']);
  });

  test('joining an unknown session id is NOT_FOUND (SESSION_NOT_FOUND)', async () => {
    // An agent of its own: an unknown agent would be AGENT_NOT_FOUND instead.
    await sessions.createAgent({ agent: { name: 'node-joiner' } });
    const error = await refusal(
      sessions.resolveSession({ agent: 'node-joiner', sessionId: 'no-such-session' }),
    );
    assert.equal(error.code, 'NOT_FOUND');
    assert.equal(error.reason, 'SESSION_NOT_FOUND');
    assert.equal(error.domain, 'switchboard');
    assert.deepEqual(error.fieldViolations, []);
    assert.match(error.message, /^NOT_FOUND SESSION_NOT_FOUND: /);
  });

  test('resumable sessions are listed without a write; expiry, paging and the log read', async () => {
    await sessions.createAgent({ agent: { name: 'node-resumer' } });
    const { session } = await sessions.resolveSession({
      agent: 'node-resumer',
      source: { transport: 'web', conversationId: 'tab-r' },
    });
    await sessions.markResumable({ agent: 'node-resumer', sessionId: session.sessionId, pending: true });
    const listed = await sessions.listResumable({ agent: 'node-resumer' });
    assert.deepEqual(listed.sessions.map((s) => s.sessionId), [session.sessionId]);
    assert.deepEqual(listed.stale, []);
    const { expired } = await sessions.expireResumable({ agent: 'node-resumer' });
    assert.deepEqual(expired, [], 'a fresh mark is not expired');

    for (const text of ['one', 'two', 'three']) {
      await sessions.appendEvents({
        agent: 'node-resumer',
        sessionId: session.sessionId,
        events: [{ messageAppended: { message: { role: 'ROLE_USER', content: text } } }],
      });
    }
    const older = [];
    let pageToken = '';
    do {
      const page = await sessions.getHistory({
        agent: 'node-resumer', sessionId: session.sessionId, limit: 2, newest: true, pageToken,
      });
      older.push(page.messages.map((m) => m.message.content));
      pageToken = page.nextPageToken;
    } while (pageToken);
    assert.deepEqual(older, [['two', 'three'], ['one']]);

    const log = await sessions.listLogEvents({
      sessionId: session.sessionId, eventTypes: ['message_appended'], branch: 'LOG_BRANCH_ACTIVE',
    });
    assert.deepEqual(log.entries.map((e) => e.event.messageAppended.message.content), ['one', 'two', 'three']);
    assert.equal(log.nextPageToken, '');
  });
});

describe('what agent frameworks store', () => {
  test('a framework session: looked up, state with an append, popped, records, erased', async () => {
    await sessions.createAgent({ agent: { name: 'node-frameworks' } });
    const source = { transport: 'adk', conversationId: 's-1', userId: 'alice' };
    const missing = await refusal(sessions.resolveSession({ agent: 'node-frameworks', source, lookupOnly: true }));
    assert.equal(missing.code, 'NOT_FOUND');
    const { session } = await sessions.resolveSession({ agent: 'node-frameworks', source });
    assert.equal(session.routingKey, routingKey('node-frameworks', source));
    const ids = { agent: 'node-frameworks', sessionId: session.sessionId };
    await sessions.appendEvents({
      ...ids,
      events: [{ messageAppended: { message: { role: 'ROLE_USER', content: 'hi' } } }],
      stateDeltas: [
        { scope: 'STATE_SCOPE_SESSION', set: { step: JSON.stringify(1) } },
        { scope: 'STATE_SCOPE_USER', set: { lang: JSON.stringify('fr') } },
      ],
    });
    await sessions.updateState({ ...ids, deltas: [{ scope: 'STATE_SCOPE_SESSION', removed: ['step'] }] });
    const { scopedState } = await sessions.getSession({ ...ids, includeState: true });
    assert.deepEqual(scopedState.session, {});
    const user = await sessions.getUserState({ agent: 'node-frameworks', userId: 'alice' });
    assert.deepEqual(user.state, { lang: '"fr"' });
    const popped = await sessions.retractMessages({ ...ids, newestCount: 1 });
    assert.deepEqual(popped.messages.map((m) => m.message.content), ['hi']);
    assert.deepEqual((await sessions.getHistory(ids)).messages, [], 'popped: no longer history');

    await sessions.putRecords({ ...ids, records: [{ kind: 'checkpoint', key: 'c1', payload: Buffer.from('blob') }] });
    const { record } = await sessions.getRecord({ ...ids, kind: 'checkpoint', key: 'c1' });
    assert.equal(Buffer.from(record.payload).toString(), 'blob');
    const listed = await sessions.listRecords({ ...ids, kind: 'checkpoint' });
    assert.deepEqual(listed.records.map((r) => r.key), ['c1']);
    const erased = await sessions.eraseRecords({ ...ids, kind: 'checkpoint', all: true });
    assert.equal(Number(erased.erasedRecords), 1);
    await sessions.eraseSession(ids);
    const gone = await refusal(sessions.resolveSession({ agent: 'node-frameworks', source }));
    assert.equal(gone.reason, 'SESSION_ERASED');
  });
});

describe('DeliveryService', () => {
  test('an obligation cut off by a crash is claimed by the next instance and delivered', async () => {
    const { instance: first } = await delivery.registerInstance({
      gatewayName: 'node-gateway',
      host: 'test-host',
      pid: String(process.pid),
      platforms: ['slack'],
    });
    assert.ok(first.instanceId);
    assert.equal(first.live, true);

    const recorded = await delivery.recordObligation({
      instanceId: first.instanceId,
      sessionKey: 'agent:node-agent:slack:group:C1:171.001',
      messageRef: '171.001',
      content: 'the reply',
      platform: 'slack',
      chatId: 'C1',
      metadata: { reply_to: '171.001' },
    });
    assert.equal(recorded.created, true);
    const row = recorded.obligation;
    assert.equal(row.state, 'OBLIGATION_STATE_PENDING');
    assert.equal(row.ownerInstanceId, first.instanceId);
    assert.match(row.id, /^[0-9a-f]{24}$/);

    const attempting = await delivery.markAttempting({
      obligationId: row.id,
      instanceId: first.instanceId,
      fence: row.fence,
    });
    assert.equal(attempting.obligation.state, 'OBLIGATION_STATE_ATTEMPTING');

    // The "crash": the first instance goes away mid-send.
    const gone = await delivery.deregisterInstance({ instanceId: first.instanceId });
    assert.equal(gone.instance.live, false);

    const { instance: second } = await delivery.registerInstance({
      gatewayName: 'node-gateway',
      platforms: ['slack'],
    });
    assert.notEqual(second.instanceId, first.instanceId);

    const claim = await delivery.claimRecoverable({ instanceId: second.instanceId });
    assert.equal(claim.obligations.length, 1);
    const claimed = claim.obligations[0];
    assert.equal(claimed.id, row.id);
    assert.equal(claimed.state, 'OBLIGATION_STATE_ATTEMPTING');
    assert.equal(claimed.ownerInstanceId, second.instanceId);
    assert.equal(claimed.needsMarker, true, 'the first send may have gone out');
    assert.notEqual(claimed.fence, row.fence);

    const delivered = await delivery.markDelivered({
      obligationId: claimed.id,
      instanceId: second.instanceId,
      fence: claimed.fence,
      platformMessageId: 'slack-ts-1',
    });
    assert.equal(delivered.obligation.state, 'OBLIGATION_STATE_DELIVERED');
    assert.equal(delivered.obligation.platformMessageId, 'slack-ts-1');

    const { obligation: stored } = await delivery.getObligation({ obligationId: row.id });
    assert.equal(stored.state, 'OBLIGATION_STATE_DELIVERED');
  });

  test('an empty session_key is INVALID_ARGUMENT naming the field', async () => {
    const { instance } = await delivery.registerInstance({ gatewayName: 'node-gateway' });
    const error = await refusal(
      delivery.recordObligation({
        instanceId: instance.instanceId,
        sessionKey: '',
        content: 'the reply',
        platform: 'slack',
        chatId: 'C1',
      }),
    );
    assert.equal(error.code, 'INVALID_ARGUMENT');
    assert.equal(error.grpcCode, 3);
    assert.deepEqual(error.fieldViolations, ['session_key']);
    assert.ok(error.reason, 'ErrorInfo reason present');
  });

  test('a hand-over names its gateway, or asks for the rows of none with fromNoGateway', async () => {
    const unnamed = await refusal(delivery.handOverObligations({ toGatewayName: 'node-gateway-2' }));
    assert.equal(unnamed.code, 'INVALID_ARGUMENT');
    assert.deepEqual(unnamed.fieldViolations, ['from_gateway_name']);
    const none = await delivery.handOverObligations({
      fromGatewayName: '', fromNoGateway: true, toGatewayName: 'node-gateway-2',
    });
    assert.equal(none.handedOverCount, '0');
  });
});

describe('dangerous operator calls', () => {
  test('checkout without a sequence is refused; the empty log is asked for with emptyLog', async () => {
    const empty = await refusal(sessions.checkout({}));
    assert.equal(empty.code, 'INVALID_ARGUMENT');
    assert.deepEqual(empty.fieldViolations, ['sequence']);
    assert.match(empty.details, /empty_log=true/);
    const truncate = await refusal(sessions.truncateLog({}));
    assert.deepEqual(truncate.fieldViolations, ['below_sequence']);
    const preview = await sessions.checkout({ sequence: 0, emptyLog: true, preview: true });
    assert.equal(preview.toSequence, '0');
    assert.equal(preview.record, null, 'a preview writes nothing');
  });
});

describe('deadlines', () => {
  test('a call that cannot complete fails within its deadline as a SwitchboardError', async () => {
    // Nothing listens on port 1: the call fails UNAVAILABLE, or DEADLINE_EXCEEDED at 300 ms.
    const client = new DeliveryClient('127.0.0.1:1', { deadlineMs: 300 });
    try {
      const started = Date.now();
      const error = await refusal(client.getLedgerStats({}, { metadata: { 'x-test': 'deadline' } }));
      assert.ok(['UNAVAILABLE', 'DEADLINE_EXCEEDED'].includes(error.code), error.code);
      assert.ok(Date.now() - started < 3000);
    } finally {
      client.close();
    }
  });
});

/**
 * A TCP proxy on 127.0.0.1 that, once armed, drops the connection at the first
 * server chunk after the client sent more: the request reached the server, its
 * answer is lost.
 * @param {string} target host:port
 */
async function losingProxy(target) {
  const net = await import('node:net');
  const [host, port] = [target.slice(0, target.lastIndexOf(':')), Number(target.slice(target.lastIndexOf(':') + 1))];
  const state = { armed: false, dropped: 0 };
  const server = net.createServer((client) => {
    const upstream = net.connect(port, host);
    let sentSinceArmed = false;
    client.on('data', (chunk) => {
      if (state.armed) sentSinceArmed = true;
      upstream.write(chunk);
    });
    upstream.on('data', (chunk) => {
      if (state.armed && sentSinceArmed) {
        state.armed = false;
        state.dropped += 1;
        client.resetAndDestroy();
        upstream.destroy();
        return;
      }
      client.write(chunk);
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('error', end);
    upstream.on('error', end);
    client.on('close', end);
    upstream.on('close', end);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(undefined)));
  const address = /** @type {import('node:net').AddressInfo} */ (server.address());
  return { address: `127.0.0.1:${address.port}`, state, close: () => server.close() };
}

describe('request ids', () => {
  test('every write, and only the writes, carries one', () => {
    assert.equal(sessions.requestIdMethods.size, 29);
    assert.equal(delivery.requestIdMethods.size, 12);
    for (const read of ['GetAgent', 'GetHistory', 'WatchEvents', 'ListResumable', 'ListLogEvents']) {
      assert.ok(!sessions.requestIdMethods.has(read), read);
    }
    for (const read of ['GetUserState', 'GetRecord', 'ListRecords']) {
      assert.ok(!sessions.requestIdMethods.has(read), read);
    }
    for (const write of ['AppendEvents', 'PostToInbox', 'Delegate', 'SendToPeer', 'ExpireResumable',
      'RetractMessages', 'UpdateState', 'PutRecords', 'EraseSession', 'EraseRecords']) {
      assert.ok(sessions.requestIdMethods.has(write), write);
    }
    const config = /** @type {any} */ (delivery.serviceConfig());
    assert.deepEqual(config.methodConfig[0].retryPolicy.retryableStatusCodes, ['UNAVAILABLE']);
    assert.equal(config.methodConfig[0].name.length, 12);
  });

  test('the same id answers with the first answer; the same id for another request is refused', async () => {
    const { instance } = await delivery.registerInstance({ gatewayName: 'node-ids', platforms: ['slack'] });
    const requestId = randomUUID();
    const request = { instanceId: instance.instanceId, sessionKey: 'ids', content: `r-${requestId}`, platform: 'slack', chatId: 'C1', requestId };
    const first = await delivery.recordObligation(request);
    const again = await delivery.recordObligation(request);
    assert.equal(first.created, true);
    assert.deepEqual(again, first);
    const error = await refusal(delivery.recordObligation({ ...request, content: 'another reply' }));
    assert.equal(error.code, 'INVALID_ARGUMENT');
    assert.equal(error.reason, 'REQUEST_ID_REUSED');
    assert.deepEqual(error.fieldViolations, ['request_id']);
  });

  test('a lost answer is retried with the same id: written once, first answer kept', async () => {
    const proxy = await losingProxy(/** @type {any} */ (services).deliveryAddress);
    const client = new DeliveryClient(proxy.address);
    try {
      const { instance } = await client.registerInstance({ gatewayName: 'node-lost', platforms: ['slack'] });
      for (let i = 0; i < 10; i += 1) {
        const content = `lost-${i}-${randomUUID()}`;
        proxy.state.armed = true;
        const recorded = await client.recordObligation({
          instanceId: instance.instanceId, sessionKey: 'lost', content, platform: 'slack', chatId: 'C1',
        });
        assert.equal(recorded.created, true, 'the retry is answered with the first answer');
        assert.equal(recorded.obligation.content, content);
      }
      assert.equal(proxy.state.dropped, 10);
      const { obligations } = await delivery.listObligations({ sessionKey: 'lost', pageSize: 100 });
      assert.equal(obligations.length, 10, 'each reply recorded once');
    } finally {
      client.close();
      proxy.close();
    }
  });
});
