// The Node clients carry writes over CallStream when several are in flight, and
// call unary otherwise: the same answers and the same errors either way.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { DeliveryClient, SessionClient, SwitchboardError } from '../src/index.js';
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
 * @param {string} text
 * @returns {object}
 */
function said(text) {
  return { messageAppended: { message: { role: 'ROLE_USER', content: text } } };
}

/**
 * The error a call failed with.
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

describe('CallStream', () => {
  test('a lone call stays unary; calls in flight together travel over one stream', async () => {
    const agent = 'node-streamer';
    await sessions.createAgent({ agent: { name: agent } });
    const ids = [];
    for (let n = 0; n < 6; n += 1) {
      const { session } = await sessions.resolveSession({ agent, source: { transport: 'web', conversationId: `s${n}` } });
      ids.push(session.sessionId);
    }
    await sessions.appendEvents({ agent, sessionId: ids[0], events: [said('alone')] });
    assert.equal(sessions.streamCalls.streams.size, 0, 'one call in flight: unary');

    const answers = await Promise.all(
      ids.flatMap((sessionId) => [1, 2, 3].map((n) => sessions.appendEvents({ agent, sessionId, events: [said(`${sessionId} ${n}`)] }))),
    );
    assert.equal(answers.length, 18);
    assert.ok(answers.every((answer) => answer.events.length === 1));
    assert.equal(sessions.streamCalls.streams.size, 1, 'carried over one stream');
    for (const sessionId of ids) {
      const { messages } = await sessions.getHistory({ agent, sessionId });
      const contents = messages.map((/** @type {any} */ m) => m.message.content).filter((c) => c.startsWith(sessionId));
      assert.deepEqual(contents.sort(), [1, 2, 3].map((n) => `${sessionId} ${n}`));
    }
  });

  test('a carried error is the unary error', async () => {
    const agent = 'node-stream-errors';
    await sessions.createAgent({ agent: { name: agent } });
    const { session } = await sessions.resolveSession({ agent, source: { transport: 'web', conversationId: 'e' } });
    const stale = () => sessions.appendEvents({ agent, sessionId: session.sessionId, expectedVersion: '99', events: [said('x')] });
    const unary = await refusal(stale());
    const [carried, other] = await Promise.all([
      refusal(stale()),
      refusal(stale()),
    ]);
    for (const error of [carried, other]) {
      assert.equal(error.code, 'ABORTED');
      assert.equal(error.reason, unary.reason);
      assert.equal(error.message, unary.message);
      assert.deepEqual(error.metadata, unary.metadata);
    }
  });

  test('the record-and-begin delivery cycle, many at once, over the stream', async () => {
    const { instance } = await delivery.registerInstance({ gatewayName: 'node-streamer', platforms: ['slack'] });
    const cycles = await Promise.all(
      Array.from({ length: 12 }, async (_, n) => {
        const { obligation } = await delivery.recordObligation({
          instanceId: instance.instanceId,
          sessionKey: `agent:node-agent:slack:dm:U${n}`,
          messageRef: `m${n}`,
          content: `reply ${n}`,
          platform: 'slack',
          chatId: `U${n}`,
          beginAttempt: true,
        });
        assert.equal(obligation.state, 'OBLIGATION_STATE_ATTEMPTING');
        return delivery.markDelivered({ obligationId: obligation.id, instanceId: instance.instanceId, fence: obligation.fence });
      }),
    );
    assert.ok(cycles.every((answer) => answer.obligation.state === 'OBLIGATION_STATE_DELIVERED'));
    assert.equal(delivery.streamCalls.streams.size, 1);
  });
});
