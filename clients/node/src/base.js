// What SessionClient and DeliveryClient share: the channel, deadlines,
// metadata, cancellation and error conversion.

import * as grpc from '@grpc/grpc-js';

import { toSwitchboardError } from './errors.js';
import { loadDefinitions } from './protos.js';

/** Unary calls fail with DEADLINE_EXCEEDED after this long unless told otherwise. */
export const DEFAULT_DEADLINE_MS = 5000;

/**
 * @typedef {object} ClientOptions
 * @property {grpc.ChannelCredentials} [credentials] Default: insecure (plaintext).
 * @property {number} [deadlineMs] Default per-call deadline of unary calls in ms (5000).
 * @property {string} [protoDir] Folder holding the Switchboard protos (default: the
 *   repository's protos/, or SWITCHBOARD_PROTO_DIR).
 * @property {grpc.ChannelOptions} [channelOptions] Passed to grpc-js.
 */

/**
 * @typedef {object} CallOptions
 * @property {number} [timeoutMs] This call's deadline, in ms from now. For a
 *   server stream, no deadline applies unless one is given.
 * @property {Date | number} [deadline] An absolute deadline (wins over timeoutMs).
 * @property {Record<string, string | string[]>} [metadata] Request headers.
 * @property {AbortSignal} [signal] Cancels the call when aborted (CANCELLED).
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
    /** @type {grpc.Client & Record<string, Function>} */
    this.stub = new constructor(
      address,
      options.credentials ?? grpc.credentials.createInsecure(),
      options.channelOptions ?? {},
    );
    /** The service's fully qualified name. */
    this.serviceName = serviceName;
    /** The default deadline of unary calls, in ms. */
    this.deadlineMs = options.deadlineMs ?? DEFAULT_DEADLINE_MS;
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
    this.stub.close();
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
   * Makes a unary call.
   * @param {string} method The RPC name as in the proto, e.g. "CreateAgent".
   * @param {object} [request]
   * @param {CallOptions} [options]
   * @returns {Promise<any>}
   */
  _unary(method, request = {}, options = {}) {
    const { metadata, callOptions } = this._prepare(options, true);
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
