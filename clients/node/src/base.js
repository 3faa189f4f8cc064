// What SessionClient and DeliveryClient share: the channel, deadlines,
// metadata, cancellation, error conversion and safe retries of writes.
//
// Every RPC whose request has a `request_id` field (the calls that write) gets
// a fresh UUID per logical call unless the caller set `requestId`, and keeps
// it on every retry, so the server answers a retry of a committed call from its
// record instead of writing twice (AIP-155). Two layers retry them:
// - the channel's service config retries UNAVAILABLE (e.g. the connection
//   dropped before the answer came) by resending the same serialized request,
//   inside the call's deadline;
// - `_unary` retries UNAVAILABLE and DEADLINE_EXCEEDED as new calls, each with a
//   deadline of its own. The service config cannot do that: a call's deadline
//   covers all its attempts (an answer that never comes uses all of it), and
//   grpc-js has no per-attempt timeout.

import { randomUUID } from 'node:crypto';

import * as grpc from '@grpc/grpc-js';

import { toSwitchboardError } from './errors.js';
import { loadDefinitions } from './protos.js';
import { StreamCalls } from './stream.js';

/** Unary calls fail with DEADLINE_EXCEEDED after this long unless told otherwise. */
export const DEFAULT_DEADLINE_MS = 5000;

/** Attempts of a call that writes, each with its own deadline. */
export const DEFAULT_MUTATION_ATTEMPTS = 3;
const MUTATION_BACKOFF_MS = 100;
/** Outcomes after which a write may or may not have run: retried with the same id. */
const RETRIED_WITH_REQUEST_ID = new Set(['UNAVAILABLE', 'DEADLINE_EXCEEDED']);

/** The channel's transparent retry of UNAVAILABLE (the same bytes, so the same id). */
export const RETRY_POLICY = Object.freeze({
  maxAttempts: 4,
  initialBackoff: '0.1s',
  maxBackoff: '2s',
  backoffMultiplier: 2,
  retryableStatusCodes: ['UNAVAILABLE'],
});

/**
 * @typedef {object} ClientOptions
 * @property {grpc.ChannelCredentials} [credentials] Default: insecure (plaintext).
 * @property {number} [deadlineMs] Default per-call deadline of unary calls in ms (5000).
 * @property {string} [protoDir] Folder holding the Switchboard protos (default: the
 *   repository's protos/, or SWITCHBOARD_PROTO_DIR).
 * @property {grpc.ChannelOptions} [channelOptions] Passed to grpc-js (a
 *   `grpc.service_config` given here replaces the client's own).
 * @property {number} [mutationAttempts] Attempts of a call that writes (3; 1 turns
 *   the retry loop off).
 */

/**
 * @typedef {object} CallOptions
 * @property {number} [timeoutMs] This call's deadline, in ms from now. For a
 *   server stream, no deadline applies unless one is given.
 * @property {Date | number} [deadline] An absolute deadline (wins over timeoutMs).
 * @property {Record<string, string | string[]>} [metadata] Request headers.
 * @property {AbortSignal} [signal] Cancels the call when aborted (CANCELLED).
 * @property {number} [attempts] For a call that writes: its attempts (default the
 *   client's mutationAttempts). An absolute `deadline` bounds all of them.
 */

/**
 * A server stream: an async iterable of responses that cancels the call when
 * the loop ends early; cancel() ends it from outside.
 * @template T
 * @typedef {AsyncGenerator<T, void, undefined> & { cancel(): void }} ResponseStream
 */

/** The shared machinery; use SessionClient or DeliveryClient. */
export class BaseClient {
  /**
   * @param {string} serviceName Fully qualified, e.g. "switchboard.session.v1.SessionService".
   * @param {string} address host:port of the service.
   * @param {ClientOptions} [options]
   */
  constructor(serviceName, address, options = {}) {
    const definitions = loadDefinitions(options.protoDir);
    /** @type {import('@grpc/proto-loader').PackageDefinition} */
    this.packageDefinition = definitions.packageDefinition;
    let constructor = /** @type {any} */ (definitions.grpcObject);
    for (const part of serviceName.split('.')) constructor = constructor?.[part];
    if (typeof constructor !== 'function') throw new Error(`${serviceName} is not in the loaded protos`);
    /** The service's fully qualified name. */
    this.serviceName = serviceName;
    /** RPC names whose requests carry a request id: the calls that write. */
    this.requestIdMethods = new Set(
      Object.entries(/** @type {Record<string, any>} */ (this.packageDefinition[serviceName]))
        // proto-loader names fields as the client sees them (camelCase). A deprecated
        // request id is ignored by the server: its call no longer writes.
        .filter(([, rpc]) =>
          rpc.requestType.type.field.some(
            (/** @type {any} */ f) => f.name === 'requestId' && !f.options?.deprecated,
          ),
        )
        .map(([name]) => name),
    );
    /** @type {grpc.Client & Record<string, Function>} */
    this.stub = new constructor(address, options.credentials ?? grpc.credentials.createInsecure(), {
      'grpc.enable_retries': 1,
      'grpc.service_config': JSON.stringify(this.serviceConfig()),
      ...(options.channelOptions ?? {}),
    });
    /** The default deadline of unary calls, in ms. */
    this.deadlineMs = options.deadlineMs ?? DEFAULT_DEADLINE_MS;
    /** Attempts of a call that writes. */
    this.mutationAttempts = Math.max(1, options.mutationAttempts ?? DEFAULT_MUTATION_ATTEMPTS);
    /** Carries writes over CallStream while other calls are in flight (./stream.js). */
    this.streamCalls = new StreamCalls(this);
  }

  /**
   * The gRPC service config of the channel: UNAVAILABLE is retried for the calls
   * that carry a request id (reads are retried by the caller, as before).
   * @returns {object}
   */
  serviceConfig() {
    const names = [...this.requestIdMethods].map((method) => ({ service: this.serviceName, method }));
    return { methodConfig: names.length ? [{ name: names, retryPolicy: RETRY_POLICY }] : [] };
  }

  /**
   * The RPC names of this service, as in the proto (PascalCase).
   * @returns {string[]}
   */
  rpcNames() {
    return Object.keys(/** @type {Record<string, unknown>} */ (this.packageDefinition[this.serviceName]));
  }

  /**
   * Waits until the channel is connected (or the deadline passes).
   * @param {number} [timeoutMs]
   * @returns {Promise<void>}
   */
  waitForReady(timeoutMs = this.deadlineMs) {
    return new Promise((resolve, reject) => {
      this.stub.waitForReady(Date.now() + timeoutMs, (error) => (error ? reject(error) : resolve()));
    });
  }

  /** Closes the channel; calls in flight are cancelled. */
  close() {
    this.streamCalls.close();
    this.stub.close();
  }

  /**
   * The raw CallStream (a grpc-js duplex stream of CallStreamRequest and
   * CallStreamResponse). The client's calls use it on their own when several are
   * in flight; this is for callers that manage correlation ids themselves.
   * @param {CallOptions} [options]
   * @returns {grpc.ClientDuplexStream<any, any>}
   */
  callStream(options = {}) {
    const { metadata, callOptions } = this._prepare(options, false);
    return this.stub.CallStream(metadata, callOptions);
  }

  /**
   * @param {CallOptions} options
   * @param {boolean} unary
   * @returns {{ metadata: grpc.Metadata, callOptions: grpc.CallOptions }}
   */
  _prepare(options, unary) {
    const metadata = new grpc.Metadata();
    for (const [key, value] of Object.entries(options.metadata ?? {})) {
      for (const item of Array.isArray(value) ? value : [value]) metadata.add(key, item);
    }
    /** @type {grpc.CallOptions} */
    const callOptions = {};
    if (options.deadline !== undefined) {
      callOptions.deadline = options.deadline;
    } else if (options.timeoutMs !== undefined || unary) {
      callOptions.deadline = Date.now() + (options.timeoutMs ?? this.deadlineMs);
    }
    return { metadata, callOptions };
  }

  /**
   * Makes a unary call; a call that writes gets a request id and is retried with it.
   * @param {string} method The RPC name as in the proto, e.g. "CreateAgent".
   * @param {Record<string, any>} [request]
   * @param {CallOptions} [options]
   * @returns {Promise<any>}
   */
  async _unary(method, request = {}, options = {}) {
    if (!this.requestIdMethods.has(method)) return this._attempt(method, request, options);
    const withId = { ...request, requestId: request.requestId || randomUUID() };
    const attempts = Math.max(1, options.attempts ?? this.mutationAttempts);
    let pause = MUTATION_BACKOFF_MS;
    for (let attempt = 1; ; attempt += 1) {
      try {
        return await this._attempt(method, withId, options);
      } catch (error) {
        const code = /** @type {{ code?: string }} */ (error).code ?? '';
        const late = options.deadline !== undefined && Date.now() >= new Date(options.deadline).getTime();
        if (attempt >= attempts || late || options.signal?.aborted || !RETRIED_WITH_REQUEST_ID.has(code)) {
          throw error;
        }
      }
      await new Promise((resolve) => setTimeout(resolve, pause * (0.5 + Math.random() / 2)));
      pause *= 2;
    }
  }

  /**
   * One attempt of a unary call, with its own deadline.
   * @param {string} method
   * @param {object} request
   * @param {CallOptions} options
   * @returns {Promise<any>}
   */
  _attempt(method, request, options) {
    const prepared = this._prepare(options, true);
    return this.streamCalls.attempt(method, request, options, prepared, () =>
      this._unaryAttempt(method, request, options, prepared),
    );
  }

  /**
   * One attempt of a unary call, as a unary RPC.
   * @param {string} method
   * @param {object} request
   * @param {CallOptions} options
   * @param {{ metadata: grpc.Metadata, callOptions: grpc.CallOptions }} prepared
   * @returns {Promise<any>}
   */
  _unaryAttempt(method, request, options, { metadata, callOptions }) {
    return new Promise((resolve, reject) => {
      const signal = options.signal;
      if (signal?.aborted) {
        reject(toSwitchboardError(cancelledError(), this.packageDefinition));
        return;
      }
      /** @type {grpc.ClientUnaryCall | undefined} */
      let call;
      const onAbort = () => call?.cancel();
      signal?.addEventListener('abort', onAbort, { once: true });
      try {
        call = this.stub[method](
          request,
          metadata,
          callOptions,
          (/** @type {grpc.ServiceError | null} */ error, /** @type {any} */ response) => {
            signal?.removeEventListener('abort', onAbort);
            if (error) reject(toSwitchboardError(error, this.packageDefinition));
            else resolve(response);
          },
        );
      } catch (error) {
        signal?.removeEventListener('abort', onAbort);
        reject(toSwitchboardError(error, this.packageDefinition));
      }
    });
  }

  /**
   * Makes a server-streaming call.
   * @param {string} method The RPC name as in the proto, e.g. "WatchEvents".
   * @param {object} [request]
   * @param {CallOptions} [options]
   * @returns {ResponseStream<any>}
   */
  _serverStream(method, request = {}, options = {}) {
    const { metadata, callOptions } = this._prepare(options, false);
    /** @type {grpc.ClientReadableStream<any>} */
    const call = this.stub[method](request, metadata, callOptions);
    // Errors reach the loop below; this keeps a late one (after the loop ended) from crashing the process.
    call.on('error', () => {});
    let cancelledByUs = false;
    const cancel = () => {
      cancelledByUs = true;
      call.cancel();
    };
    const signal = options.signal;
    if (signal?.aborted) cancel();
    signal?.addEventListener('abort', cancel, { once: true });
    const packageDefinition = this.packageDefinition;
    async function* iterate() {
      try {
        for await (const response of call) yield response;
      } catch (error) {
        const converted = toSwitchboardError(error, packageDefinition);
        // Cancelled by us (cancel(), or the signal) is an ordinary end, unless the signal asked to abort.
        if (!(cancelledByUs && converted.code === 'CANCELLED' && !signal?.aborted)) throw converted;
      } finally {
        signal?.removeEventListener('abort', cancel);
        cancelledByUs = true;
        call.cancel();
      }
    }
    const stream = /** @type {ResponseStream<any>} */ (iterate());
    stream.cancel = cancel;
    return stream;
  }
}

/** @returns {Error & { code: number, details: string }} */
function cancelledError() {
  return Object.assign(new Error('Cancelled on client'), {
    code: grpc.status.CANCELLED,
    details: 'Cancelled on client',
  });
}
