// The offline key builder reproduces the server's rule: every published vector
// (protos/testdata/session_keys.json, read from the repository).

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, test } from 'node:test';

import { routingKey } from '../src/index.js';

const VECTORS_URL = new URL('../../../protos/testdata/session_keys.json', import.meta.url);
/** @type {{ vectors: Array<Record<string, any>> }} */
const { vectors } = JSON.parse(readFileSync(VECTORS_URL, 'utf8'));

/**
 * A vector's proto-JSON object (snake_case) in the client's field names (camelCase).
 * @param {Record<string, unknown>} fields
 * @returns {Record<string, any>}
 */
function camelCased(fields) {
  return Object.fromEntries(
    Object.entries(fields).map(([name, value]) => [
      name.replace(/_([a-z])/g, (_, letter) => letter.toUpperCase()),
      value,
    ]),
  );
}

describe('routingKey', () => {
  for (const vector of vectors) {
    test(vector.name, () => {
      const source = camelCased(vector.stored_source ?? vector.source);
      assert.equal(routingKey(vector.agent, /** @type {any} */ (source), camelCased(vector.policy)), vector.key);
    });
  }

  test('takes the chat type as its number too', () => {
    assert.equal(
      routingKey('main', { transport: 'telegram', chatType: 1, chatId: 'a:b' }),
      'agent:main:telegram:dm:c=a%3Ab',
    );
  });

  test('refuses what the server would not route', () => {
    assert.throws(() => routingKey('main', { transport: 'telegram', chatId: '1' }), /chatType/);
    assert.throws(() => routingKey('main', { transport: 'peer', conversationId: 'x' }), /fromAgent/);
    assert.throws(
      () => routingKey('main', { transport: 'slack', chatType: 'CHAT_TYPE_DM', chatId: ':'.repeat(200) }),
      /limit is 512/,
    );
  });
});
