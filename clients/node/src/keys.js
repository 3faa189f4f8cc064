// Routing keys built offline, by the SessionService's rule: for a gateway that
// needs a conversation's key without asking the service. The service is the
// authority (Session.routingKey); this rule, checked against the published
// vectors (protos/testdata/session_keys.json), is injective:
//
//   agent:<agent>:<transport>:<chat type>[:s=<scope>][:c=<chat>][:t=<thread>][:u=<user>]
//   agent:<agent>:<transport>[:u=<user>]:id=<conversation id>       web, cron, repl, frameworks
//   agent:<agent>:peer:from=<fromAgent>:id=<conversation id>         peer
//
// with '%' and ':' in every id written '%25' and '%3A'. The agent frameworks'
// transports ('adk', 'openai_agents', 'langgraph') are non-chat ones. Build from the source as
// the service stores it: for an agent that redacts PII its chat, thread and user
// ids are hashed with the service's PII key first (so such keys need that key); a
// peer source names its sending agent in `fromAgent`.

/** The agent frameworks' session stores (Google ADK, OpenAI Agents, LangGraph). */
export const FRAMEWORK_TRANSPORTS = Object.freeze(new Set(['adk', 'openai_agents', 'langgraph']));
export const NON_CHAT_TRANSPORTS = Object.freeze(
  new Set(['web', 'cron', 'repl', 'peer', ...FRAMEWORK_TRANSPORTS]),
);
export const MAX_ROUTING_KEY_LEN = 512;

/** @type {Map<string | number, string>} ChatType (name or number) -> the key's word. */
const CHAT_TYPE_NAMES = new Map([
  ['CHAT_TYPE_DM', 'dm'], [1, 'dm'],
  ['CHAT_TYPE_GROUP', 'group'], [2, 'group'],
  ['CHAT_TYPE_CHANNEL', 'channel'], [3, 'channel'],
  ['CHAT_TYPE_THREAD', 'thread'], [4, 'thread'],
]);

/**
 * A Source as the client's messages carry it (camelCase fields; chatType as its
 * enum name or number).
 * @typedef {object} KeySource
 * @property {string} transport
 * @property {string} [conversationId]
 * @property {string | number} [chatType]
 * @property {string} [chatId]
 * @property {string} [threadId]
 * @property {string} [userId]
 * @property {string} [scopeId]
 * @property {string} [fromAgent]
 */

/**
 * @typedef {object} KeyPolicy
 * @property {boolean} [sharedGroupSessions]
 * @property {boolean} [perUserThreadSessions]
 */

/**
 * The key the service gives `source` (as stored) for `agent` under `policy`.
 * Throws a TypeError for a source the service would refuse to route.
 * @param {string} agent
 * @param {KeySource} source
 * @param {KeyPolicy} [policy]
 * @returns {string}
 */
export function routingKey(agent, source, policy = {}) {
  const head = [`agent:${agent}:${source.transport}`];
  if (!NON_CHAT_TRANSPORTS.has(source.transport)) {
    const chatType = CHAT_TYPE_NAMES.get(source.chatType ?? 0);
    if (chatType === undefined) {
      throw new TypeError('a chat source needs chatType DM, GROUP, CHANNEL or THREAD');
    }
    head.push(chatType);
  } else if (source.transport === 'peer' && !source.fromAgent) {
    throw new TypeError('a peer source needs fromAgent: the agent that sends into it');
  }
  const ids = keyIds(source, policy)
    .filter(([, value]) => value)
    .map(([marker, value]) => `${marker}=${escaped(value)}`);
  const key = [...head, ...ids].join(':');
  if (key.length > MAX_ROUTING_KEY_LEN) {
    throw new TypeError(`the key has ${key.length} characters; the limit is ${MAX_ROUTING_KEY_LEN}`);
  }
  return key;
}

/**
 * An id with the separator and the escape character percent-encoded.
 * @param {string} value
 * @returns {string}
 */
export function escaped(value) {
  return value.replaceAll('%', '%25').replaceAll(':', '%3A');
}

/**
 * (marker, id) in key order; empty ids are left out by the caller.
 * @param {KeySource} source
 * @param {KeyPolicy} policy
 * @returns {Array<[string, string]>}
 */
function keyIds(source, policy) {
  if (source.transport === 'peer') {
    return [['from', source.fromAgent ?? ''], ['id', source.conversationId ?? '']];
  }
  if (NON_CHAT_TRANSPORTS.has(source.transport)) {
    return [['u', source.userId ?? ''], ['id', source.conversationId ?? '']];
  }
  /** @type {Array<[string, string]>} */
  const ids = [['s', source.scopeId ?? '']];
  if (CHAT_TYPE_NAMES.get(source.chatType ?? 0) === 'dm') {
    const owner = source.chatId ? ['c', source.chatId] : ['u', source.userId ?? ''];
    return [...ids, /** @type {[string, string]} */ (owner), ['t', source.threadId ?? '']];
  }
  ids.push(['c', source.chatId ?? ''], ['t', source.threadId ?? '']);
  const perUser =
    !policy.sharedGroupSessions && (!source.threadId || Boolean(policy.perUserThreadSessions));
  if (perUser) ids.push(['u', source.userId ?? '']);
  return ids;
}
