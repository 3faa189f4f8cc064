// SessionClient: a promise-returning method for every RPC of
// switchboard.session.v1.SessionService (protos/switchboard/session/v1/session_service.proto).
// Requests and responses are plain objects with camelCase fields (see
// README.md). Keep the methods in step with the proto: a test fails when an
// RPC has none.

import { BaseClient } from './base.js';

/** @typedef {import('./base.js').ClientOptions} ClientOptions */
/** @typedef {import('./base.js').CallOptions} CallOptions */
/** @typedef {Record<string, any>} ProtoMessage */
/**
 * @template T
 * @typedef {import('./base.js').ResponseStream<T>} ResponseStream
 */

export class SessionClient extends BaseClient {
  /**
   * @param {string} address host:port of the SessionService.
   * @param {ClientOptions} [options]
   */
  constructor(address, options) {
    super('switchboard.session.v1.SessionService', address, options);
  }

  /**
   * Creates an agent; its initial state is the agent's first event.
   * @param {ProtoMessage} [request] CreateAgentRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} CreateAgentResponse
   */
  createAgent(request, options) {
    return this._unary('CreateAgent', request, options);
  }

  /**
   * Reads an agent, memory included.
   * @param {ProtoMessage} [request] GetAgentRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} GetAgentResponse
   */
  getAgent(request, options) {
    return this._unary('GetAgent', request, options);
  }

  /**
   * Lists agents by name, paginated.
   * @param {ProtoMessage} [request] ListAgentsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ListAgentsResponse
   */
  listAgents(request, options) {
    return this._unary('ListAgents', request, options);
  }

  /**
   * Changes the fields named in update_mask.
   * @param {ProtoMessage} [request] UpdateAgentRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} UpdateAgentResponse
   */
  updateAgent(request, options) {
    return this._unary('UpdateAgent', request, options);
  }

  /**
   * Archives an agent: kept in the log, no longer routable.
   * @param {ProtoMessage} [request] DeleteAgentRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} DeleteAgentResponse
   */
  deleteAgent(request, options) {
    return this._unary('DeleteAgent', request, options);
  }

  /**
   * Sets one memory entry of an agent (shared by all its sessions).
   * @param {ProtoMessage} [request] PutMemoryRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} PutMemoryResponse
   */
  putMemory(request, options) {
    return this._unary('PutMemory', request, options);
  }

  /**
   * Removes one memory entry of an agent.
   * @param {ProtoMessage} [request] DeleteMemoryRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} DeleteMemoryResponse
   */
  deleteMemory(request, options) {
    return this._unary('DeleteMemory', request, options);
  }

  /**
   * The default mapping from a message's source to its session: the first
   * message creates the session, the same routing key resumes it. With
   * session_id set, joins that existing session instead (NOT_FOUND if it is
   * not one of the agent's sessions; nothing is created).
   * @param {ProtoMessage} [request] ResolveSessionRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ResolveSessionResponse
   */
  resolveSession(request, options) {
    return this._unary('ResolveSession', request, options);
  }

  /**
   * Creates a session explicitly (ALREADY_EXISTS for a taken id).
   * @param {ProtoMessage} [request] SpawnSessionRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} SpawnSessionResponse
   */
  spawnSession(request, options) {
    return this._unary('SpawnSession', request, options);
  }

  /**
   * Reads a session's summary.
   * @param {ProtoMessage} [request] GetSessionRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} GetSessionResponse
   */
  getSession(request, options) {
    return this._unary('GetSession', request, options);
  }

  /**
   * Lists an agent's sessions, newest first, paginated.
   * @param {ProtoMessage} [request] ListSessionsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ListSessionsResponse
   */
  listSessions(request, options) {
    return this._unary('ListSessions', request, options);
  }

  /**
   * Ends a session with a reason; its routing key no longer resolves to it.
   * @param {ProtoMessage} [request] EndSessionRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} EndSessionResponse
   */
  endSession(request, options) {
    return this._unary('EndSession', request, options);
  }

  /**
   * The explicit reset ("/new"): ends the session with a reason and points its
   * routing key to a fresh session.
   * @param {ProtoMessage} [request] ResetSessionRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ResetSessionResponse
   */
  resetSession(request, options) {
    return this._unary('ResetSession', request, options);
  }

  /**
   * Appends events to a session atomically (all or none). With
   * expected_version, ABORTED when the session moved on meanwhile.
   * @param {ProtoMessage} [request] AppendEventsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} AppendEventsResponse
   */
  appendEvents(request, options) {
    return this._unary('AppendEvents', request, options);
  }

  /**
   * Puts a message into a session's inbox: the sanctioned second writer. It
   * never conflicts with a running turn (the session version does not move).
   * @param {ProtoMessage} [request] PostToInboxRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} PostToInboxResponse
   */
  postToInbox(request, options) {
    return this._unary('PostToInbox', request, options);
  }

  /**
   * A window of a session's message history, paged with next_page_token
   * (backwards, to older messages, with newest).
   * @param {ProtoMessage} [request] GetHistoryRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} GetHistoryResponse
   */
  getHistory(request, options) {
    return this._unary('GetHistory', request, options);
  }

  /**
   * A session's current state: latest snapshot plus the replayed tail.
   * @param {ProtoMessage} [request] GetSessionStateRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} GetSessionStateResponse
   */
  getSessionState(request, options) {
    return this._unary('GetSessionState', request, options);
  }

  /**
   * Writes snapshots of a session (and its agent) now.
   * @param {ProtoMessage} [request] SnapshotSessionRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} SnapshotSessionResponse
   */
  snapshotSession(request, options) {
    return this._unary('SnapshotSession', request, options);
  }

  /**
   * Streams log events after a sequence, live; filtered by agent or session
   * (rewind records reach every filter). The raw log: events a later rewind
   * abandons were streamed when they were appended.
   * @param {ProtoMessage} [request] WatchEventsRequest
   * @param {CallOptions} [options]
   * @returns {ResponseStream<ProtoMessage>} WatchEventsResponse messages
   */
  watchEvents(request, options) {
    return this._serverStream('WatchEvents', request, options);
  }

  /**
   * Names the current head of the log.
   * @param {ProtoMessage} [request] CreateCheckpointRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} CreateCheckpointResponse
   */
  createCheckpoint(request, options) {
    return this._unary('CreateCheckpoint', request, options);
  }

  /**
   * Lists checkpoints, oldest first, paginated (page_size, page_token).
   * @param {ProtoMessage} [request] ListCheckpointsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ListCheckpointsResponse
   */
  listCheckpoints(request, options) {
    return this._unary('ListCheckpoints', request, options);
  }

  /**
   * Moves every agent and every session atomically back to a sequence: a
   * rewind record is appended at R and everything in (target, R) is abandoned
   * (kept, but no longer part of any state). FAILED_PRECONDITION
   * (REWIND_INTO_ABANDONED) for a target on an abandoned branch; OUT_OF_RANGE
   * (REWIND_BEYOND_RETENTION) below the retained log. Idempotent. Sequence 0,
   * the empty log, is reached only with `emptyLog: true` (INVALID_ARGUMENT,
   * field "sequence", without it).
   * @param {ProtoMessage} [request] RewindRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} RewindResponse
   */
  rewind(request, options) {
    return this._unary('Rewind', request, options);
  }

  /**
   * Like Rewind, but to any sequence, abandoned branches included: the state
   * becomes what it was at that sequence when it was appended. Undoes a rewind.
   * `sequence` is required: 0 (or none) is the empty log and is checked out only
   * with `emptyLog: true`, else INVALID_ARGUMENT (field "sequence").
   * @param {ProtoMessage} [request] CheckoutRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} CheckoutResponse
   */
  checkout(request, options) {
    return this._unary('Checkout', request, options);
  }

  /**
   * Deletes log events below a sequence, when every agent and session keeps a
   * snapshot that makes them unnecessary. Rewind records are always kept.
   * `belowSequence` is required (at least 1; INVALID_ARGUMENT otherwise).
   * @param {ProtoMessage} [request] TruncateLogRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} TruncateLogResponse
   */
  truncateLog(request, options) {
    return this._unary('TruncateLog', request, options);
  }

  /**
   * Branches a session under the same agent: a new session whose history and
   * state are the source's at a sequence, with its lineage recorded. A
   * narrowing restricts it below the agent's permissions (forks inherit it).
   * @param {ProtoMessage} [request] ForkSessionRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ForkSessionResponse
   */
  forkSession(request, options) {
    return this._unary('ForkSession', request, options);
  }

  /**
   * Hands a task to another agent: opens or resumes its session for the peer
   * source {conversation_id "<from agent>:<context>", from_agent <from agent>},
   * with lineage back to the delegating session, and puts the task into that
   * session's inbox. Gated ("peer.delegate").
   * @param {ProtoMessage} [request] DelegateRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} DelegateResponse
   */
  delegate(request, options) {
    return this._unary('Delegate', request, options);
  }

  /**
   * Puts a message into another agent's session inbox, by source (default
   * mapping) or by session id (NOT_FOUND if unknown). Gated ("peer.send").
   * A peer source is bound to the sending agent (Source.from_agent); a sender
   * naming another agent is INVALID_ARGUMENT (PEER_SENDER_MISMATCH).
   * @param {ProtoMessage} [request] SendToPeerRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} SendToPeerResponse
   */
  sendToPeer(request, options) {
    return this._unary('SendToPeer', request, options);
  }

  /**
   * Decides whether a session may do an action on a resource and records the
   * decision in the session's log (an audit trail that rewinds too).
   * @param {ProtoMessage} [request] CheckPermissionRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} CheckPermissionResponse
   */
  checkPermission(request, options) {
    return this._unary('CheckPermission', request, options);
  }

  /**
   * Marks a session's turn as interrupted (resumable) or clears the mark.
   * @param {ProtoMessage} [request] MarkResumableRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} MarkResumableResponse
   */
  markResumable(request, options) {
    return this._unary('MarkResumable', request, options);
  }

  /**
   * Suspends a session (never auto-resumed) or lifts the suspension.
   * @param {ProtoMessage} [request] SuspendSessionRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} SuspendSessionResponse
   */
  suspendSession(request, options) {
    return this._unary('SuspendSession', request, options);
  }

  /**
   * Interrupted sessions still fresh enough to resume (`sessions`) and the stale
   * ones (`stale`, not to be continued). A read: it writes nothing.
   * @param {ProtoMessage} [request] ListResumableRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ListResumableResponse
   */
  listResumable(request, options) {
    return this._unary('ListResumable', request, options);
  }

  /**
   * Resets the agent's stale interrupted sessions (reason
   * "resume_pending_expired"); answers the sessions it ended.
   * @param {ProtoMessage} [request] ExpireResumableRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ExpireResumableResponse
   */
  expireResumable(request, options) {
    return this._unary('ExpireResumable', request, options);
  }

  /**
   * A page of the global log for operators (admin only): by sequence range,
   * agent, session, event type and branch (active, abandoned or both).
   * @param {ProtoMessage} [request] ListLogEventsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ListLogEventsResponse
   */
  listLogEvents(request, options) {
    return this._unary('ListLogEvents', request, options);
  }

  /**
   * Records what an operator did (admin only) as an event of the log that no
   * rewind abandons; the principal is the caller's token, never the request's.
   * @param {ProtoMessage} [request] RecordOperatorActionRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} RecordOperatorActionResponse
   */
  recordOperatorAction(request, options) {
    return this._unary('RecordOperatorAction', request, options);
  }

  // -- what agent frameworks store (scoped state, retraction, records, erasure) --------
  // Sessions are addressed by a framework's ids with resolveSession (a non-chat source
  // with transport 'adk', 'openai_agents' or 'langgraph', userId and conversationId;
  // lookupOnly never creates). State values are JSON text: JSON.stringify them.

  /**
   * Takes the newest messages (newestCount) or those at `sequences` out of the
   * history in one logged, versioned change, and answers them (none: nothing written).
   * @param {ProtoMessage} [request] RetractMessagesRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} RetractMessagesResponse
   */
  retractMessages(request, options) {
    return this._unary('RetractMessages', request, options);
  }

  /**
   * Applies scoped state deltas (session, user, agent) atomically, without events.
   * @param {ProtoMessage} [request] UpdateStateRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} UpdateStateResponse
   */
  updateState(request, options) {
    return this._unary('UpdateState', request, options);
  }

  /**
   * The state an agent keeps for one of its users (a read).
   * @param {ProtoMessage} [request] GetUserStateRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} GetUserStateResponse
   */
  getUserState(request, options) {
    return this._unary('GetUserState', request, options);
  }

  /**
   * Stores records (opaque payloads with kind, namespace, key, metadata and labels)
   * in one logged event; unversioned unless `versioned`.
   * @param {ProtoMessage} [request] PutRecordsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} PutRecordsResponse
   */
  putRecords(request, options) {
    return this._unary('PutRecords', request, options);
  }

  /**
   * A record by key, or the newest of a namespace, with its payload (and children).
   * @param {ProtoMessage} [request] GetRecordRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} GetRecordResponse
   */
  getRecord(request, options) {
    return this._unary('GetRecord', request, options);
  }

  /**
   * Records of a kind, newest put first, filtered and paged with nextPageToken.
   * @param {ProtoMessage} [request] ListRecordsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ListRecordsResponse
   */
  listRecords(request, options) {
    return this._unary('ListRecords', request, options);
  }

  /**
   * Erases a session for good: no rewind or checkout brings its content back.
   * @param {ProtoMessage} [request] EraseSessionRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} EraseSessionResponse
   */
  eraseSession(request, options) {
    return this._unary('EraseSession', request, options);
  }

  /**
   * Erases records of a kind by keys, labels, all, or all but the newest per
   * namespace, with their children of `childrenKind`.
   * @param {ProtoMessage} [request] EraseRecordsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} EraseRecordsResponse
   */
  eraseRecords(request, options) {
    return this._unary('EraseRecords', request, options);
  }
}
