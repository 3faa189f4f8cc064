// Writes carried over the service's CallStream while other calls are in flight.
//
// A client whose calls overlap (a gateway serving several chats at once) sends
// each write the service's CallStream carries (appends, inbox posts, the ledger
// transitions) over one bidirectional stream instead of one unary call each;
// the server commits the ones that arrive together in one transaction. A lone
// call stays unary, the simple path, and so does every call against a server
// without CallStream (UNIMPLEMENTED, remembered). A carried call answers
// exactly as its unary twin: the same response, the same SwitchboardError, the
// same request id (one that failed UNAVAILABLE because its stream broke is
// retried by `_unary` with its id, like a unary one). Each carries its
// attempt's deadline as its `timeout`.

import * as grpc from '@grpc/grpc-js';

import { toSwitchboardError } from './errors.js';

const STATUS_DETAILS_KEY = 'grpc-status-details-bin';

/**
 * @typedef {object} PendingCall
 * @property {(response: any) => void} resolve
 * @property {(error: unknown) => void} reject
 */

/** Times a call goes again on a new stream after its stream ended unanswered. */
const RESENDS = 3;

/** The stream ended cleanly (the server stopping, or ending an old stream) before
 * this call was answered: it never ran, and goes again on a new stream. */
class Unanswered extends Error {}

/** One open CallStream: answers are matched to calls by correlation id. */
class OpenStream {
  /**
   * @param {import('./base.js').BaseClient} client
   * @param {grpc.Metadata} metadata The stream's headers (its calls share them).
   */
  constructor(client, metadata) {
    this.client = client;
    /** @type {Map<string, PendingCall>} */
    this.pending = new Map();
    this.nextId = 0;
    /** @type {unknown} Set once the stream has ended: what its calls failed with. */
    this.broken = undefined;
    this.call = client.stub.CallStream(metadata, {});
    this.call.on('data', (/** @type {any} */ answer) => this._answered(answer));
    this.call.on('error', (/** @type {unknown} */ error) => this._ended(error));
    // A clean end answered every call the server read: the rest never ran.
    this.call.on('end', () => this._ended(new Unanswered()));
  }

  /**
   * @param {string} field The CallStreamRequest field carrying this kind of call.
   * @param {object} request
   * @param {number} timeoutMs
   * @returns {Promise<any>}
   */
  send(field, request, timeoutMs) {
    if (this.broken !== undefined) return Promise.reject(this.broken);
    const correlationId = String(this.nextId++);
    const ms = Math.max(0, timeoutMs);
    const timeout = { seconds: String(Math.floor(ms / 1000)), nanos: Math.round((ms % 1000) * 1e6) };
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(correlationId);
        reject(this._error(grpc.status.DEADLINE_EXCEEDED, `no answer on the call stream within ${ms} ms`));
      }, ms);
      this.pending.set(correlationId, {
        resolve: (response) => (clearTimeout(timer), resolve(response)),
        reject: (error) => (clearTimeout(timer), reject(error)),
      });
      this.call.write({ correlationId, timeout, [field]: request });
    });
  }

  /** @param {any} answer */
  _answered(answer) {
    const pending = this.pending.get(answer.correlationId);
    if (!pending) return;
    this.pending.delete(answer.correlationId);
    if (answer.result !== 'error') {
      pending.resolve(answer[answer.result]);
      return;
    }
    const statusType = /** @type {any} */ (this.client.packageDefinition['google.rpc.Status']);
    const metadata = new grpc.Metadata();
    metadata.set(STATUS_DETAILS_KEY, statusType.serialize(answer.error));
    pending.reject(this._error(answer.error.code, answer.error.message, metadata));
  }

  /** @param {unknown} error */
  _ended(error) {
    if (this.broken !== undefined) return;
    const code = /** @type {{ code?: unknown }} */ (error).code;
    if (error instanceof Unanswered) this.broken = error;
    else if (typeof code === 'number') this.broken = toSwitchboardError(error, this.client.packageDefinition);
    else this.broken = this._error(grpc.status.UNAVAILABLE, String(/** @type {Error} */ (error).message ?? error));
    for (const pending of this.pending.values()) pending.reject(this.broken);
    this.pending.clear();
  }

  /**
   * A SwitchboardError as a unary call with this status would have raised.
   * @param {number} code
   * @param {string} message
   * @param {grpc.Metadata} [metadata]
   */
  _error(code, message, metadata = new grpc.Metadata()) {
    const error = Object.assign(new Error(message), { code, details: message, metadata });
    return toSwitchboardError(error, this.client.packageDefinition);
  }

  close() {
    this.call.end();
  }
}

/** A client's carrier: counts its calls in flight and carries writes while others are. */
export class StreamCalls {
  /** @param {import('./base.js').BaseClient} client */
  constructor(client) {
    this.client = client;
    this.inFlight = 0;
    /** @type {Map<string, OpenStream>} One stream per set of headers (a token each). */
    this.streams = new Map();
    this.unimplemented = false;
    /** RPC name -> the CallStreamRequest field that carries it. */
    this.fields = carriedFields(client);
  }

  /**
   * One attempt of a call: over the stream when it carries this RPC and another
   * call is in flight, else `unary()`. A call with an AbortSignal stays unary
   * (a carried call cannot be cancelled on its own).
   * @param {string} method
   * @param {object} request
   * @param {import('./base.js').CallOptions} options
   * @param {{ metadata: grpc.Metadata, callOptions: grpc.CallOptions }} prepared
   * @param {() => Promise<any>} unary
   * @returns {Promise<any>}
   */
  async attempt(method, request, options, prepared, unary) {
    const field = this.fields.get(method);
    const others = this.inFlight;
    this.inFlight += 1;
    try {
      if (field === undefined || others === 0 || this.unimplemented || options.signal) return await unary();
      const deadline = new Date(prepared.callOptions.deadline ?? Date.now()).getTime();
      for (let sent = 0; sent < RESENDS; sent += 1) {
        try {
          return await this._stream(options, prepared.metadata).send(field, request, deadline - Date.now());
        } catch (error) {
          if (error instanceof Unanswered) continue; // on a new stream
          if (/** @type {{ code?: string }} */ (error).code !== 'UNIMPLEMENTED') throw error;
          this.unimplemented = true; // a server from before CallStream
          break;
        }
      }
      return await unary();
    } finally {
      this.inFlight -= 1;
    }
  }

  /**
   * @param {import('./base.js').CallOptions} options
   * @param {grpc.Metadata} metadata
   * @returns {OpenStream}
   */
  _stream(options, metadata) {
    const key = JSON.stringify(options.metadata ?? {});
    let stream = this.streams.get(key);
    if (stream === undefined || stream.broken !== undefined) {
      stream = new OpenStream(this.client, metadata);
      this.streams.set(key, stream);
    }
    return stream;
  }

  close() {
    for (const stream of this.streams.values()) stream.close();
    this.streams.clear();
  }
}

/**
 * RPC name -> CallStreamRequest field, read from the loaded protos (none when the
 * service has no CallStream).
 * @param {import('./base.js').BaseClient} client
 * @returns {Map<string, string>}
 */
function carriedFields(client) {
  const rpcs = /** @type {Record<string, any>} */ (client.packageDefinition[client.serviceName]);
  const carrier = rpcs.CallStream;
  /** @type {Map<string, string>} */
  const fields = new Map();
  if (!carrier) return fields;
  for (const [name, rpc] of Object.entries(rpcs)) {
    const field = carrier.requestType.type.field.find(
      (/** @type {any} */ f) => f.type === 'TYPE_MESSAGE' && f.typeName === rpc.requestType.type.name,
    );
    if (field && name !== 'CallStream') fields.set(name, field.name);
  }
  return fields;
}
