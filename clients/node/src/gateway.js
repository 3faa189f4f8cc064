// A reference gateway runtime for Node: chat platforms <-> an agent, with the
// delivery ledger. The same contract as the Python reference gateway
// (clients/python/switchboard_client/gateway.py): the same boot order, marker
// text, obligation ids, session keys and row metadata, so that either gateway
// recovers the other's rows.
//
// One turn:
//   inbound message -> ResolveSession -> inbox post with the resume mark -> the agent
//   callback -> RecordObligation (straight into ATTEMPTING) -> platform send
//   -> MarkDelivered / MarkFailed -> history, resume mark cleared.
// One platform message is one turn: a session accepts one inbox post per messageRef,
// and a repeat (a platform's retry, the update reaching two instances) comes back
// `duplicate`, having written nothing, its mark included. Its turn is the first
// delivery's: no second one runs, and the resume rules judge it by that mark.
// The ledger never blocks a send: if the DeliveryService is unreachable, the
// reply still goes out (unrecorded) and the failure is logged.
//
// Boot (Hermes' order): connect the platforms, register the instance with those
// that connected and start heartbeats -> claim and redeliver what dead instances
// owed (with the marker where the first send may have gone out) -> only then
// resume interrupted turns that are still fresh, so a turn whose answer is owed
// already is redelivered, never re-run. While running, a periodic claim picks up
// retries and orphans and looks again at turns left to a live holder.
//
// Reply targets (./reply-targets.js), as the Python gateway: with a reply key the
// gateway seals where a turn's reply goes onto the resume mark and into the ledger
// row (whose chatId and threadId stay empty), and opens it to resume the turn or
// redeliver the row. Without a key it refuses to start for an agent that redacts
// PII. A target it cannot open is never answered at a hashed id: a resumed turn is
// given up (logged, mark cleared, ledger untouched; its messages wait in the inbox
// for the user's next message), a claimed row is left claimed and unmarked for a
// gateway holding the key once this one has stopped.

import os from 'node:os';

import { SwitchboardError } from './errors.js';
import { ReplyKeyRefused, TargetUnreadable, replySealer } from './reply-targets.js';

/** Prefixed to a recovered reply whose first send may have reached the platform. */
export const RECOVERED_MARKER = '[recovered reply: you may have seen this message already]\n';

/** Row states that mean "still owed": redelivered by a claim, never re-run. */
const OWED = new Set(['OBLIGATION_STATE_PENDING', 'OBLIGATION_STATE_ATTEMPTING', 'OBLIGATION_STATE_FAILED']);
const DELIVERED = 'OBLIGATION_STATE_DELIVERED';

/**
 * A platform refused a send. `retryable` (default true) tells the ledger to try
 * again later (after `retryAfterS` seconds when the platform said so, e.g. a 429's
 * retry_after; otherwise the server's backoff); false abandons the reply.
 */
export class SendFailed extends Error {
  /**
   * @param {string} message
   * @param {{ retryable?: boolean, retryAfterS?: number | null }} [options]
   */
  constructor(message, options = {}) {
    super(message);
    this.name = 'SendFailed';
    /** Whether the ledger should try again. */
    this.retryable = options.retryable ?? true;
    /** @type {number | null} Seconds the platform asked to wait, or null. */
    this.retryAfterS = options.retryAfterS ?? null;
  }
}

/**
 * What a chat platform offers the gateway. Extend this class, or pass any object
 * with `name`, `connect` and `send`: the optional capabilities default to the
 * safe answer (sends are not idempotent; whether a send arrived is unknown), and
 * a recovered reply then carries the marker.
 */
export class PlatformAdapter {
  /** @param {string} name The platform's name ("slack", "telegram"), as in routing keys. */
  constructor(name) {
    /** The platform's name, as in routing keys and the ledger's `platform`. */
    this.name = name;
    /** True when the platform drops a second send carrying the same idempotency key. */
    this.idempotentSends = false;
  }

  /**
   * Connects (logs in, opens the socket). Throwing leaves the platform out of
   * the instance's platforms: nothing is claimed or sent for it.
   * @returns {Promise<void>}
   */
  async connect() {}

  /**
   * Sends a message; resolves to the platform's message id. Throw SendFailed
   * when the platform refused it (any other error is treated as a retryable
   * failure: the reply may or may not have gone out).
   * @param {string} chatId
   * @param {string} threadId "" when not in a thread.
   * @param {string} text
   * @param {string} idempotencyKey The obligation id ("" when the ledger was unreachable).
   * @returns {Promise<string>}
   */
  async send(chatId, threadId, text, idempotencyKey) {
    void chatId, threadId, text, idempotencyKey;
    throw new Error(`${this.name}: send() is not implemented`);
  }

  /**
   * The platform's message id if a send with this key arrived, null if not or unknown.
   * @param {string} idempotencyKey
   * @returns {Promise<string | null>}
   */
  async wasDelivered(idempotencyKey) {
    void idempotencyKey;
    return null;
  }
}

/**
 * @typedef {object} Adapter What the gateway needs of a platform (see PlatformAdapter).
 * @property {string} name
 * @property {boolean} [idempotentSends] Missing: false.
 * @property {() => (Promise<void> | void)} connect
 * @property {(chatId: string, threadId: string, text: string, idempotencyKey: string) => (Promise<string> | string)} send
 * @property {(idempotencyKey: string) => (Promise<string | null> | string | null)} [wasDelivered] Missing: unknown.
 */

/**
 * @typedef {object} Inbound A message a platform (or another transport) handed to the gateway.
 * @property {Record<string, any>} source A Source: transport, chatType ('CHAT_TYPE_DM'), chatId, ...
 * @property {string} text
 * @property {string} [messageRef] The platform's id of the message (part of the reply's ledger id).
 * @property {string} [replyPlatform] Where the reply goes (default: the source's transport).
 * @property {string} [replyChatId] (default: the source's chat id, or its conversation id).
 */

/**
 * @typedef {object} Turn What the agent callback sees.
 * @property {Record<string, any>} session The Session.
 * @property {Record<string, any>} state The GetSessionStateResponse: `state.state.inbox`
 *   holds the pending user messages (the inbound one last).
 * @property {Record<string, any>[]} history The newest history messages (QueuedMessage).
 * @property {Inbound | null} inbound null when an interrupted turn is resumed.
 */

/**
 * @typedef {object} Logger
 * @property {(message: string) => void} info
 * @property {(message: string) => void} warn
 * @property {(message: string) => void} error
 */

/**
 * @typedef {object} GatewayOptions
 * @property {string} name The gateway name: the bot account (only its instances claim its rows).
 * @property {string} agent
 * @property {import('./session.js').SessionClient} sessions
 * @property {import('./delivery.js').DeliveryClient} delivery
 * @property {Adapter[]} adapters
 * @property {(turn: Turn) => (Promise<string> | string)} callback The agent: a turn -> the reply.
 * @property {number} [heartbeatMs] 10000.
 * @property {number} [claimEveryMs] 15000.
 * @property {number} [historyWindow] 50 messages.
 * @property {number} [leaseTtlS] This instance's lease in seconds (default: the server's, 30 s):
 *   without a heartbeat for this long it counts as dead and its rows are recovered by others.
 * @property {number} [recordTimeoutMs] Deadline of the record before a send (2000): the ledger never holds a send up for long.
 * @property {string | Uint8Array | null} [replyKey] Seals reply targets (32 random bytes, hex or
 *   base64); default: SWITCHBOARD_REPLY_KEY, else none. A short or placeholder key throws
 *   ReplyKeyRefused here; start() refuses an agent that redacts PII without a key.
 * @property {Logger} [logger] Default: warnings and errors to the console.
 */

/** @type {Logger} */
const CONSOLE_LOGGER = {
  info: () => {},
  warn: (message) => console.warn(`switchboard gateway: ${message}`),
  error: (message) => console.error(`switchboard gateway: ${message}`),
};

export class Gateway {
  /** @param {GatewayOptions} options */
  constructor(options) {
    this.name = options.name;
    this.agent = options.agent;
    this.sessions = options.sessions;
    this.delivery = options.delivery;
    /** @type {Map<string, Adapter>} */
    this.adapters = new Map(options.adapters.map((adapter) => [adapter.name, adapter]));
    this.callback = options.callback;
    this.heartbeatMs = options.heartbeatMs ?? 10_000;
    this.claimEveryMs = options.claimEveryMs ?? 15_000;
    this.historyWindow = options.historyWindow ?? 50;
    this.leaseTtlS = options.leaseTtlS ?? null;
    this.recordTimeoutMs = options.recordTimeoutMs ?? 2000;
    /** Seals reply targets; null: no reply key, targets are recorded in clear. */
    this.sealer = replySealer(options.replyKey);
    this.log = options.logger ?? CONSOLE_LOGGER;
    /** This process start's ledger instance id ("" before start()). */
    this.instanceId = '';
    /** @type {Set<string>} Platforms that connected. */
    this.connected = new Set();
    /** @type {Set<string>} Sessions whose turn a live instance was running when we looked. */
    this.deferred = new Set();
    /** @type {Map<object, string>} The sessions whose inbound messages this process handles now, per delivery. */
    this._handling = new Map();
    /** @type {NodeJS.Timeout[]} */
    this._timers = [];
    /** @type {Set<Promise<void>>} Periodic runs in flight, awaited by stop(). */
    this._running = new Set();
    // One resume pass at a time: the periodic one and a caller's never run a turn twice.
    /** @type {Promise<unknown>} */
    this._resuming = Promise.resolve();
    this._stopped = false;
  }

  // -- life ---------------------------------------------------------------------------

  /** Hermes' boot order: connect, register + heartbeats, recover owed replies, resume turns. */
  async start() {
    await this._requireKeyForRedaction();
    for (const adapter of this.adapters.values()) {
      try {
        await adapter.connect();
        this.connected.add(adapter.name);
      } catch (error) {
        this.log.error(`platform ${adapter.name} did not connect: ${describe(error)}`);
      }
    }
    /** @type {Record<string, any>} */
    const request = {
      gatewayName: this.name,
      platforms: this.platforms(),
      host: os.hostname(),
      pid: String(process.pid),
    };
    if (this.leaseTtlS) request.leaseTtl = duration(this.leaseTtlS);
    const { instance } = await this.delivery.registerInstance(request);
    this.instanceId = instance.instanceId;
    this._every(this.heartbeatMs, () => this._heartbeat());
    await this.recover();
    await this.resumeInterrupted();
    this._every(this.claimEveryMs, () => this._periodicClaim());
  }

  async _requireKeyForRedaction() {
    if (this.sealer) return;
    const { agent } = await this.sessions.getAgent({ name: this.agent });
    if (agent.settings?.redactPii) {
      throw new ReplyKeyRefused(
        `agent ${JSON.stringify(this.agent)} redacts PII: give the gateway a reply key (the replyKey ` +
          'option or SWITCHBOARD_REPLY_KEY, 32 random bytes, e.g. `openssl rand -hex 32`, the same ' +
          'for every gateway), or its resumed replies have nowhere to go and raw chat ids reach the ' +
          'delivery ledger',
      );
    }
  }

  /** Graceful stop: this instance's unfinished rows become claimable at once. */
  async stop() {
    this._stopped = true;
    for (const timer of this._timers) clearTimeout(timer);
    this._timers = [];
    await Promise.allSettled([...this._running]);
    if (!this.instanceId) return;
    try {
      await this.delivery.deregisterInstance({ instanceId: this.instanceId });
    } catch (error) {
      this.log.warn(`deregistering ${this.instanceId} failed: ${describe(error)}`);
    }
  }

  /**
   * A platform came back: say so at once and deliver what waited for it.
   * @param {string} platform
   */
  async reconnected(platform) {
    this.connected.add(platform);
    await this.delivery.heartbeat({ instanceId: this.instanceId, platforms: this.platforms() });
    await this.recover([platform]);
  }

  /** @returns {string[]} The connected platforms, sorted (as the Python gateway sends them). */
  platforms() {
    return [...this.connected].sort();
  }

  /**
   * Runs `task` every `ms`, never two at once (the next run is scheduled when one ends).
   * @param {number} ms
   * @param {() => Promise<void>} task
   */
  _every(ms, task) {
    const slot = this._timers.length;
    const schedule = () => {
      if (this._stopped) return;
      this._timers[slot] = setTimeout(() => {
        const run = task().finally(() => {
          this._running.delete(run);
          schedule();
        });
        this._running.add(run);
      }, ms);
    };
    schedule();
  }

  async _heartbeat() {
    try {
      await this.delivery.heartbeat({ instanceId: this.instanceId, platforms: this.platforms() });
    } catch (error) {
      this.log.warn(`heartbeat failed; retrying in ${this.heartbeatMs} ms: ${describe(error)}`);
    }
  }

  async _periodicClaim() {
    try {
      await this.recover();
      await this.resumeDeferred();
    } catch (error) {
      this.log.warn(`periodic claim failed: ${describe(error)}`);
    }
  }

  // -- turns --------------------------------------------------------------------------

  /**
   * One turn for an inbound message; resolves to the reply that was sent ('' when the
   * session had the message already: another delivery's turn, see _duplicate).
   * @param {Inbound} inbound
   * @returns {Promise<string>}
   */
  async handle(inbound) {
    const { session } = await this.sessions.resolveSession({ agent: this.agent, source: inbound.source });
    // Known as handled here from before the post, so that a second delivery of the
    // message to this process, answered `duplicate`, finds this one.
    const delivery = {};
    this._handling.set(delivery, session.sessionId);
    const target = inboundTarget(inbound);
    try {
      // The resume mark and the post in one transaction: a crash never leaves a stored,
      // unmarked message, and a duplicate writes neither. The mark names this instance,
      // so a gateway booting meanwhile leaves the turn to us, and carries the sealed
      // target to answer.
      const posted = await this.sessions.postToInbox({
        agent: this.agent,
        sessionId: session.sessionId,
        message: {
          role: 'ROLE_USER',
          content: inbound.text,
          sender: inbound.source.userId ?? '',
          messageRef: inbound.messageRef ?? '',
        },
        markResumable: true,
        resumeHolder: this.instanceId,
        replyTarget: this._sealed(target),
      });
      if (posted.duplicate) return await this._duplicate(session.sessionId, inbound, delivery);
      return await this._runTurn(session, inbound, target);
    } finally {
      this._handling.delete(delivery);
    }
  }

  /**
   * The session accepted this platform message before and this post wrote nothing:
   * the turn is the first delivery's, marked by it, and none runs here, unless that
   * turn failed in this very process. The resume rules judge it by its mark: a live
   * holder finishes it; a dead (or unknown) one's is resumed, now or at a periodic
   * claim, as at boot. Resolves to the reply this call sent ('' for none).
   * @param {string} sessionId
   * @param {Inbound} inbound
   * @param {object} delivery
   * @returns {Promise<string>}
   */
  async _duplicate(sessionId, inbound, delivery) {
    const { session } = await this.sessions.getSession({ agent: this.agent, sessionId });
    if (!session.resumePending) return ''; // the first delivery's turn has ended
    if (session.resumeHolder !== this.instanceId) {
      this.deferred.add(sessionId);
      await this.resumeDeferred();
      return '';
    }
    for (const [other, handled] of this._handling) {
      // A turn runs here now (the first delivery's, or a later message's): it answers
      // the inbox it read, this message included.
      if (other !== delivery && handled === sessionId) return '';
    }
    // It failed here (the agent threw; the platform retries): take it up, answering only
    // what no reply covers yet, as a resume does.
    return this._resume(session, inbound);
  }

  /** Re-runs the turns a crash cut off, if still fresh (stale ones are reset). */
  resumeInterrupted() {
    return this._resumePass(() => true);
  }

  /** Looks again at deferred turns: resumes those whose holder has died since. */
  async resumeDeferred() {
    if (this.deferred.size) await this._resumePass((session) => this.deferred.has(session.sessionId));
  }

  /**
   * @param {(session: Record<string, any>) => boolean} wanted
   * @returns {Promise<void>}
   */
  _resumePass(wanted) {
    const pass = this._resuming.catch(() => {}).then(() => this._resumeNow(wanted));
    this._resuming = pass;
    return pass;
  }

  /** @param {(session: Record<string, any>) => boolean} wanted */
  async _resumeNow(wanted) {
    // Stale turns are reset, not continued: their users start afresh.
    await this.sessions.expireResumable({ agent: this.agent });
    const { sessions: resumable } = await this.sessions.listResumable({ agent: this.agent });
    // A deferred turn no longer listed was finished (or reset): forget it.
    const listed = new Set(resumable.map((/** @type {any} */ s) => s.sessionId));
    for (const id of this.deferred) if (!listed.has(id)) this.deferred.delete(id);
    for (const session of resumable) {
      if (session.suspended || !wanted(session)) continue;
      const holder = session.resumeHolder;
      if (holder && holder === this.instanceId) continue; // running here (a failed turn: next boot)
      if (holder && (await this._isLive(holder))) {
        this.deferred.add(session.sessionId);
        continue;
      }
      this.deferred.delete(session.sessionId);
      await this._resumeSafely(session);
    }
  }

  /**
   * Whether the instance holding a mark still runs (an empty holder is unknown).
   * @param {string} instanceId
   */
  async _isLive(instanceId) {
    try {
      const { instance } = await this.delivery.getInstance({ instanceId });
      return Boolean(instance.live);
    } catch (error) {
      if (error instanceof SwitchboardError && error.code === 'NOT_FOUND') return false;
      // Unsure: leave the turn alone now and look again at the next periodic claim.
      this.log.warn(`could not tell whether ${instanceId} is live: ${describe(error)}`);
      return true;
    }
  }

  /**
   * One session's failure (the agent or a platform throwing) must not cost the
   * others their resume, nor the gateway its start; the mark stays for a later boot.
   * @param {Record<string, any>} session
   */
  async _resumeSafely(session) {
    try {
      await this._resume(session);
    } catch (error) {
      this.log.error(`resuming session ${session.sessionId} failed; its mark stays: ${describe(error)}`);
    }
  }

  /**
   * Answers only what no reply covers yet: an owed reply is redelivered by a claim,
   * a delivered one only completes its turn; neither is re-run. `inbound`: the
   * platform's retry of the message taking the turn up (its reply goes where the
   * message says). Resolves to the reply sent ('' for none).
   * @param {Record<string, any>} session
   * @param {Inbound | null} [inbound]
   * @returns {Promise<string>}
   */
  async _resume(session, inbound = null) {
    const key = session.routingKey || session.sessionId;
    const rows = (await this._listObligations(key)).filter((row) => row.metadata?.session_id === session.sessionId);
    if (rows.some((row) => OWED.has(row.state))) return '';
    let latest = null;
    for (const row of rows) {
      if (row.state !== DELIVERED) continue;
      if (!latest || inboxThrough(row) > inboxThrough(latest)) latest = row;
    }
    const answeredThrough = latest ? inboxThrough(latest) : 0n;
    const { state } = await this.sessions.getSessionState({ agent: this.agent, sessionId: session.sessionId });
    const inbox = state.inbox ?? [];
    if (inbox.some((/** @type {any} */ q) => BigInt(q.sequence) > answeredThrough)) {
      let target;
      try {
        target = inbound ? inboundTarget(inbound) : this._resumedTarget(session);
      } catch (error) {
        if (!(error instanceof TargetUnreadable)) throw error;
        this.log.error(
          `the interrupted turn of session ${session.sessionId} is not resumed: ${error.message}; ` +
            "its mark is cleared and its messages wait in the inbox for the user's next message",
        );
        await this._mark(session.sessionId, false);
        return '';
      }
      this.log.info(`resuming interrupted session ${session.sessionId}`);
      // Take the turn over (the mark keeps its time: freshness still counts from the crash).
      const sealed = session.replyTarget?.length ? session.replyTarget : this._sealed(target);
      await this._mark(session.sessionId, true, this.instanceId, sealed);
      return this._runTurn(session, inbound, target);
    }
    if (latest && inbox.length) {
      await this._finishTurn(session.sessionId, latest.content, inbox, answeredThrough);
    } else {
      await this._mark(session.sessionId, false);
    }
    return '';
  }

  /**
   * Where an interrupted turn's reply goes: the target sealed on its mark, else (a mark
   * of an older gateway) the session's source, unless its ids are hashed.
   * @param {Record<string, any>} session
   * @returns {import('./reply-targets.js').ReplyTarget}
   */
  _resumedTarget(session) {
    if (session.replyTarget?.length) {
      if (!this.sealer) throw new TargetUnreadable('its reply target is sealed and this gateway has no key');
      return this.sealer.open(session.replyTarget);
    }
    const source = session.source ?? {};
    if (holdsHashedIds(source)) {
      throw new TargetUnreadable(
        'its session holds hashed ids (the agent redacts PII) and its mark carries no sealed reply target',
      );
    }
    return { platform: source.transport ?? '', chatId: source.chatId || source.conversationId || '', threadId: source.threadId ?? '' };
  }

  /**
   * @param {import('./reply-targets.js').ReplyTarget} target
   * @returns {Buffer}
   */
  _sealed(target) {
    return this.sealer ? this.sealer.seal(target) : Buffer.alloc(0);
  }

  /**
   * Every row of a session key, all pages.
   * @param {string} sessionKey
   * @returns {Promise<Record<string, any>[]>}
   */
  async _listObligations(sessionKey) {
    const rows = [];
    let pageToken = '';
    do {
      const page = await this.delivery.listObligations({ sessionKey, pageToken });
      rows.push(...page.obligations);
      pageToken = page.nextPageToken;
    } while (pageToken);
    return rows;
  }

  /**
   * @param {Record<string, any>} session
   * @param {Inbound | null} inbound
   * @param {import('./reply-targets.js').ReplyTarget} target
   * @returns {Promise<string>}
   */
  async _runTurn(session, inbound, target) {
    const sessionId = session.sessionId;
    const state = await this.sessions.getSessionState({ agent: this.agent, sessionId });
    const { messages: history } = await this.sessions.getHistory({
      agent: this.agent,
      sessionId,
      limit: this.historyWindow,
      newest: true,
    });
    const reply = await this.callback({ session, state, history, inbound });
    const inbox = state.state.inbox ?? [];
    const through = inbox.length ? BigInt(inbox[inbox.length - 1].sequence) : 0n;
    const messageRef = inbound ? (inbound.messageRef ?? '') : `resume:${session.lastSequence}`;
    // Where the reply belongs, so that a gateway recovering it can finish the turn.
    const metadata = { agent: this.agent, session_id: sessionId, inbox_through: String(through) };
    const outcome = await this.deliver({
      sessionKey: session.routingKey || sessionId,
      messageRef,
      content: reply,
      platform: target.platform,
      chatId: target.chatId,
      threadId: target.threadId,
      metadata,
    });
    // The turn ends with the reply, even one still to be retried: a mark left
    // behind would go stale and reset the conversation. A claim that redelivers
    // the reply later finds the turn finished. 'owed elsewhere': the instance
    // that owes it finishes the turn when it delivers.
    if (outcome !== 'owed elsewhere') await this._finishTurn(sessionId, reply, inbox, through);
    return reply;
  }

  /**
   * Moves the turn's inbox into the history with the reply; clears the resume mark.
   * @param {string} sessionId
   * @param {string} reply
   * @param {Record<string, any>[]} inbox
   * @param {bigint} through
   */
  async _finishTurn(sessionId, reply, inbox, through) {
    /** @type {Record<string, any>[]} */
    const events = inbox.map((q) => ({
      messageAppended: { message: { role: 'ROLE_USER', content: q.message.content, sender: q.message.sender } },
    }));
    events.push({ messageAppended: { message: { role: 'ROLE_ASSISTANT', content: reply } } });
    if (through) events.push({ inboxDrained: { throughSequence: String(through) } });
    await this.sessions.appendEvents({ agent: this.agent, sessionId, events });
    await this._mark(sessionId, false);
  }

  /**
   * @param {string} sessionId
   * @param {boolean} pending
   * @param {string} [holder]
   * @param {Uint8Array} [replyTarget] The sealed target; empty for none.
   */
  _mark(sessionId, pending, holder = '', replyTarget = Buffer.alloc(0)) {
    return this.sessions.markResumable({ agent: this.agent, sessionId, pending, holder, replyTarget });
  }

  // -- delivery -----------------------------------------------------------------------

  /**
   * Records the reply as owed (straight into ATTEMPTING), then sends it; the ledger
   * never blocks the send. Resolves to what happened:
   * - 'sent': the platform took it (now, or before: this reply to this message
   *   was recorded and delivered by this instance already, so it is not sent twice);
   * - 'retrying': the send failed retryably, a claim redelivers it;
   * - 'given up': the send failed for good (or unrecorded: nobody will retry it);
   * - 'owed elsewhere': this reply was recorded before by another instance, which
   *   delivered it already or owes it (redelivered by a claim): not sent again.
   * @param {{ sessionKey: string, messageRef: string, content: string, platform: string,
   *   chatId: string, threadId?: string, metadata?: Record<string, string> }} reply
   * @returns {Promise<'sent' | 'retrying' | 'given up' | 'owed elsewhere'>}
   */
  async deliver(reply) {
    const adapter = this.adapters.get(reply.platform);
    if (!adapter) throw new Error(`no platform adapter named ${JSON.stringify(reply.platform)}`);
    const recorded = await this._recordBestEffort(reply);
    const row = recorded?.obligation ?? null;
    if (recorded && (row.ownerInstanceId !== this.instanceId || !recorded.created)) {
      this.log.info(`reply ${row.id} is recorded already (${row.state}); not sending it again`);
      // Ours and delivered: this very reply to this very message went out before
      // (the platform handed the message over twice, say). Otherwise its holder
      // (another instance, or a claim of ours) delivers it.
      const ours = row.ownerInstanceId === this.instanceId && row.state === DELIVERED;
      return ours ? 'sent' : 'owed elsewhere';
    }
    return this._send(adapter, row, reply.chatId, reply.threadId ?? '', reply.content);
  }

  /**
   * RecordObligation for the send path: on any failure, logs and resolves to null.
   * @param {{ sessionKey: string, messageRef: string, content: string, platform: string,
   *   chatId: string, threadId?: string, metadata?: Record<string, string> }} reply
   * @returns {Promise<{ obligation: Record<string, any>, created: boolean } | null>}
   */
  async _recordBestEffort(reply) {
    // With a key, the row holds the target sealed: no raw chat id reaches the ledger.
    const threadId = reply.threadId ?? '';
    const sealed = this._sealed({ platform: reply.platform, chatId: reply.chatId, threadId });
    try {
      return await this.delivery.recordObligation(
        {
          instanceId: this.instanceId,
          sessionKey: reply.sessionKey,
          messageRef: reply.messageRef,
          content: reply.content,
          platform: reply.platform,
          chatId: sealed.length ? '' : reply.chatId,
          threadId: sealed.length ? '' : threadId,
          sealedTarget: sealed,
          metadata: reply.metadata ?? {},
          beginAttempt: true,
        },
        // The send must not wait for retries of the record.
        { timeoutMs: this.recordTimeoutMs, attempts: 1 },
      );
    } catch (error) {
      // Content stays out of the log on purpose: it is the user's message.
      this.log.warn(
        `delivery ledger: reply not recorded, sending it unrecorded ` +
          `(session_key=${JSON.stringify(reply.sessionKey)}, platform=${JSON.stringify(reply.platform)}): ${describe(error)}`,
      );
      return null;
    }
  }

  /**
   * Claims what is owed (dead instances' rows, due retries) and redelivers it.
   * Resolves to the number of rows claimed.
   * @param {string[]} [platforms] Default: the platforms of the latest heartbeat.
   * @returns {Promise<number>}
   */
  async recover(platforms) {
    /** @type {Record<string, any>} */
    const request = { instanceId: this.instanceId };
    if (platforms) request.deliverablePlatforms = { platforms };
    const { obligations } = await this.delivery.claimRecoverable(request);
    for (const row of obligations) {
      const adapter = this.adapters.get(row.platform);
      // The server claims only for connected platforms; never send to one that is not.
      if (!adapter || !this.connected.has(row.platform)) continue;
      const idempotent = adapter.idempotentSends === true;
      if (!idempotent) {
        const already = adapter.wasDelivered ? await adapter.wasDelivered(row.id) : null;
        if (already !== null && already !== undefined) {
          await this._markDelivered(row, already);
          await this._finishRecoveredTurn(row);
          continue;
        }
      }
      let target;
      try {
        target = this._rowTarget(row);
      } catch (error) {
        if (!(error instanceof TargetUnreadable)) throw error;
        this.log.error(
          `reply ${row.id} is not redelivered: ${error.message}; it stays claimed by this instance, ` +
            'unmarked, for a gateway holding the key once this one stops',
        );
        continue;
      }
      const text = row.needsMarker && !idempotent ? RECOVERED_MARKER + row.content : row.content;
      await this._send(adapter, row, target.chatId, target.threadId, text);
      await this._finishRecoveredTurn(row); // whatever the outcome, as for a first send
    }
    return obligations.length;
  }

  /**
   * Where a claimed row goes: its sealed target opened, else its chat in clear.
   * @param {Record<string, any>} row
   * @returns {import('./reply-targets.js').ReplyTarget}
   */
  _rowTarget(row) {
    if (!row.sealedTarget?.length) return { platform: row.platform, chatId: row.chatId, threadId: row.threadId };
    if (!this.sealer) throw new TargetUnreadable('its target is sealed and this gateway has no reply key');
    const target = this.sealer.open(row.sealedTarget);
    if (target.platform !== row.platform) {
      throw new TargetUnreadable('its sealed target names another platform than the row');
    }
    return target;
  }

  /**
   * A redelivered reply completes the turn it came from, so it is not re-run;
   * unless that turn was finished already (its inbox drained when a first send
   * failed and was left to a retry): the reply is in the history once.
   * @param {Record<string, any>} row
   */
  async _finishRecoveredTurn(row) {
    const sessionId = row.metadata?.session_id ?? '';
    if (row.metadata?.agent !== this.agent || !sessionId) return;
    try {
      const { state } = await this.sessions.getSessionState({ agent: this.agent, sessionId });
      const through = inboxThrough(row);
      const inbox = (state.inbox ?? []).filter((/** @type {any} */ q) => BigInt(q.sequence) <= through);
      if (through && !inbox.length) return;
      await this._finishTurn(sessionId, row.content, inbox, through);
    } catch (error) {
      if (!(error instanceof SwitchboardError)) throw error;
      this.log.warn(`could not complete the recovered turn of ${sessionId}: ${describe(error)}`);
    }
  }

  /**
   * Sends and records the outcome.
   * @param {Adapter} adapter
   * @param {Record<string, any> | null} row null: the reply is unrecorded.
   * @param {string} chatId
   * @param {string} threadId
   * @param {string} text
   * @returns {Promise<'sent' | 'retrying' | 'given up'>}
   */
  async _send(adapter, row, chatId, threadId, text) {
    let platformId;
    try {
      platformId = await adapter.send(chatId, threadId, text, row ? row.id : '');
    } catch (error) {
      // Anything but a SendFailed may have happened after the message went out
      // (a timeout, say): retry it, and the retry carries the marker.
      const failed = error instanceof SendFailed ? error : new SendFailed(describe(error));
      this.log.warn(`send to ${adapter.name} failed: ${failed.message}`);
      if (!row) return 'given up';
      try {
        /** @type {Record<string, any>} */
        const request = {
          obligationId: row.id,
          instanceId: this.instanceId,
          fence: row.fence,
          error: failed.message,
          retryable: failed.retryable,
        };
        if (failed.retryAfterS !== null) request.retryAfter = duration(failed.retryAfterS);
        await this.delivery.markFailed(request);
      } catch (markError) {
        this.log.warn(`ledger update failed: ${describe(markError)}`);
      }
      return failed.retryable ? 'retrying' : 'given up';
    }
    if (row) await this._markDelivered(row, String(platformId ?? ''));
    return 'sent';
  }

  /**
   * @param {Record<string, any>} row
   * @param {string} platformMessageId
   */
  async _markDelivered(row, platformMessageId) {
    try {
      await this.delivery.markDelivered({
        obligationId: row.id,
        instanceId: this.instanceId,
        fence: row.fence,
        platformMessageId,
      });
    } catch (error) {
      this.log.warn(`ledger update failed: ${describe(error)}`);
    }
  }
}

/**
 * Where the reply to an inbound message goes: its reply target, else its source's.
 * @param {Inbound} inbound
 * @returns {import('./reply-targets.js').ReplyTarget}
 */
function inboundTarget(inbound) {
  const source = inbound.source;
  const platform = (inbound.replyPlatform ?? '') || source.transport;
  const chatId = (inbound.replyChatId ?? '') || source.chatId || source.conversationId || '';
  return { platform, chatId, threadId: source.threadId ?? '' };
}

/**
 * Whether a stored source's chat or user id is in the SessionService's hashed form
 * (its agent redacts PII): such an id names no chat a platform knows.
 * @param {Record<string, any>} source
 */
function holdsHashedIds(source) {
  const chatId = source.chatId ?? '';
  const hashedChat = chatId === `${source.transport}:${chatId.slice(-12)}` && /^[0-9a-f]{12}$/.test(chatId.slice(-12));
  return hashedChat || /^user_[0-9a-f]{12}$/.test(source.userId ?? '');
}

/**
 * The last inbox sequence a recorded reply answers (its `inbox_through` metadata).
 * @param {Record<string, any>} row
 * @returns {bigint}
 */
function inboxThrough(row) {
  return BigInt(row.metadata?.inbox_through || '0');
}

/**
 * A google.protobuf.Duration from seconds.
 * @param {number} seconds
 * @returns {{ seconds: string, nanos: number }}
 */
function duration(seconds) {
  const whole = Math.floor(seconds);
  return { seconds: String(whole), nanos: Math.round((seconds - whole) * 1e9) };
}

/** @param {unknown} error */
function describe(error) {
  return error instanceof Error ? error.message : String(error);
}
