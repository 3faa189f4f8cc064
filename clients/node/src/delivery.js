// DeliveryClient: a promise-returning method for every RPC of
// switchboard.delivery.v1.DeliveryService (protos/switchboard/delivery/v1/delivery_service.proto).
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

export class DeliveryClient extends BaseClient {
  /**
   * @param {string} address host:port of the DeliveryService.
   * @param {ClientOptions} [options]
   */
  constructor(address, options) {
    super('switchboard.delivery.v1.DeliveryService', address, options);
  }

  /**
   * Registers a gateway process start. Every process start gets a fresh
   * instance id: a restarted process is a new instance, and the rows of its
   * predecessor are orphans.
   * @param {ProtoMessage} [request] RegisterInstanceRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} RegisterInstanceResponse
   */
  registerInstance(request, options) {
    return this._unary('RegisterInstance', request, options);
  }

  /**
   * Extends an instance's lease and replaces its set of connected platforms.
   * An instance whose lease has passed or that deregistered stays dead:
   * FAILED_PRECONDITION (reason INSTANCE_NOT_LIVE), register anew.
   * @param {ProtoMessage} [request] HeartbeatRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} HeartbeatResponse
   */
  heartbeat(request, options) {
    return this._unary('Heartbeat', request, options);
  }

  /**
   * Ends an instance (graceful stop). Its unfinished rows become claimable at
   * once. Idempotent.
   * @param {ProtoMessage} [request] DeregisterInstanceRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} DeregisterInstanceResponse
   */
  deregisterInstance(request, options) {
    return this._unary('DeregisterInstance', request, options);
  }

  /**
   * Reads one instance, with `live` judged on the database's clock now (a
   * lease that has run out reads as dead). Read-only. An unknown id is
   * NOT_FOUND (reason INSTANCE_NOT_FOUND).
   * @param {ProtoMessage} [request] GetInstanceRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} GetInstanceResponse
   */
  getInstance(request, options) {
    return this._unary('GetInstance', request, options);
  }

  /**
   * Records a final reply as owed (state PENDING, or ATTEMPTING with
   * begin_attempt) before it is sent. The id is
   * sha256(session_key|message_ref|content)[:24]. Insert-or-ignore: recording
   * the same reply again returns the stored row unchanged with created=false.
   * @param {ProtoMessage} [request] RecordObligationRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} RecordObligationResponse
   */
  recordObligation(request, options) {
    return this._unary('RecordObligation', request, options);
  }

  /**
   * PENDING -> ATTEMPTING, just before the platform send. Fenced.
   * @param {ProtoMessage} [request] MarkAttemptingRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} MarkAttemptingResponse
   */
  markAttempting(request, options) {
    return this._unary('MarkAttempting', request, options);
  }

  /**
   * PENDING or ATTEMPTING -> DELIVERED. Fenced; repeating it as the holder is
   * idempotent.
   * @param {ProtoMessage} [request] MarkDeliveredRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} MarkDeliveredResponse
   */
  markDelivered(request, options) {
    return this._unary('MarkDelivered', request, options);
  }

  /**
   * PENDING or ATTEMPTING -> FAILED (retryable, with a next-attempt time) or
   * ABANDONED (not retryable). Fenced; repeating it as the holder is idempotent.
   * @param {ProtoMessage} [request] MarkFailedRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} MarkFailedResponse
   */
  markFailed(request, options) {
    return this._unary('MarkFailed', request, options);
  }

  /**
   * Claims owed rows for redelivery, fleet-wide: abandons rows over the
   * attempts cap or past the stale cutoff, leaves rows for platforms the caller
   * cannot deliver to untouched, and moves each claimed row to ATTEMPTING
   * under the caller with a new fence. Exactly one caller wins each row. Only
   * rows bound to the caller instance's gateway (or to none) and, for an agent
   * or gateway token, rows of its agents.
   * @param {ProtoMessage} [request] ClaimRecoverableRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ClaimRecoverableResponse
   */
  claimRecoverable(request, options) {
    return this._unary('ClaimRecoverable', request, options);
  }

  /**
   * Reads one obligation.
   * @param {ProtoMessage} [request] GetObligationRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} GetObligationResponse
   */
  getObligation(request, options) {
    return this._unary('GetObligation', request, options);
  }

  /**
   * Lists obligations, oldest first, with filters and pagination.
   * @param {ProtoMessage} [request] ListObligationsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ListObligationsResponse
   */
  listObligations(request, options) {
    return this._unary('ListObligations', request, options);
  }

  /**
   * Lists gateway instances, latest registered first, with liveness and the owed
   * rows each holds, paginated (admin only).
   * @param {ProtoMessage} [request] ListInstancesRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} ListInstancesResponse
   */
  listInstances(request, options) {
    return this._unary('ListInstances', request, options);
  }

  /**
   * How many rows ListObligations would list with these filters, in all and per
   * session key. A read: it writes nothing.
   * @param {ProtoMessage} [request] CountObligationsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} CountObligationsResponse
   */
  countObligations(request, options) {
    return this._unary('CountObligations', request, options);
  }

  /**
   * Operator action (admin only): makes a FAILED or ABANDONED row due for
   * redelivery now, with its attempts budget reset. A DELIVERED row is never
   * reopened.
   * @param {ProtoMessage} [request] RetryObligationRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} RetryObligationResponse
   */
  retryObligation(request, options) {
    return this._unary('RetryObligation', request, options);
  }

  /**
   * Operator action (admin only): gives up on a non-terminal row.
   * @param {ProtoMessage} [request] AbandonObligationRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} AbandonObligationResponse
   */
  abandonObligation(request, options) {
    return this._unary('AbandonObligation', request, options);
  }

  /**
   * Counts per state, age of the oldest pending row, rows in doubt and rows
   * waiting for a platform that no live instance of their gateway has
   * connected. Admin only.
   * @param {ProtoMessage} [request] GetLedgerStatsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} GetLedgerStatsResponse
   */
  getLedgerStats(request, options) {
    return this._unary('GetLedgerStats', request, options);
  }

  /**
   * Deletes terminal rows (DELIVERED, ABANDONED) older than the retention.
   * Never deletes a row that is still owed. Admin only.
   * @param {ProtoMessage} [request] PruneObligationsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} PruneObligationsResponse
   */
  pruneObligations(request, options) {
    return this._unary('PruneObligations', request, options);
  }

  /**
   * Operator action (admin only): binds owed rows (PENDING, ATTEMPTING,
   * FAILED) of one gateway to another, so that the other gateway's instances
   * claim them when they become recoverable. Only the binding changes: a live
   * holder keeps its row and fence. `fromGatewayName` is required; the rows of
   * no known gateway are named with an empty one and `fromNoGateway: true`.
   * @param {ProtoMessage} [request] HandOverObligationsRequest
   * @param {CallOptions} [options]
   * @returns {Promise<ProtoMessage>} HandOverObligationsResponse
   */
  handOverObligations(request, options) {
    return this._unary('HandOverObligations', request, options);
  }
}
