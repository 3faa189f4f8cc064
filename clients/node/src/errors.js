// One error type for every failed call, with the server's machine-readable
// details: a google.rpc.ErrorInfo (a stable `reason` such as "STALE_FENCE")
// and, for INVALID_ARGUMENT, a google.rpc.BadRequest naming the offending
// fields. Branch on `code` and `reason`, never on `message`.

import * as grpc from '@grpc/grpc-js';

const STATUS_DETAILS_KEY = 'grpc-status-details-bin';
const ERROR_INFO = 'google.rpc.ErrorInfo';
const BAD_REQUEST = 'google.rpc.BadRequest';

/** @type {Map<number, string>} gRPC numeric status code -> its name ("NOT_FOUND"). */
const CODE_NAMES = new Map(
  Object.entries(grpc.status)
    .filter(([name, value]) => typeof value === 'number' && /^[A-Z_]+$/.test(name))
    .map(([name, value]) => [/** @type {number} */ (value), name]),
);

/** @type {Map<string, number>} The reverse: "NOT_FOUND" -> 5. */
const CODE_NUMBERS = new Map([...CODE_NAMES].map(([value, name]) => [name, value]));

/** @typedef {import('@grpc/proto-loader').MessageTypeDefinition<object, object>} MessageType */

/**
 * The name of a gRPC status code, e.g. 5 -> "NOT_FOUND".
 * @param {number} code
 * @returns {string}
 */
export function codeName(code) {
  return CODE_NAMES.get(code) ?? 'UNKNOWN';
}

/**
 * @typedef {object} FieldViolation
 * @property {string} field The request field, as the server names it (snake_case path).
 * @property {string} description What is wrong with it.
 */

/**
 * @typedef {object} SwitchboardErrorInit
 * @property {string} [reason] ErrorInfo.reason; "" when the status has none.
 * @property {string} [domain] ErrorInfo.domain ("switchboard").
 * @property {Record<string, string>} [metadata] ErrorInfo.metadata.
 * @property {FieldViolation[]} [violations] BadRequest.field_violations.
 * @property {Error} [cause] The grpc-js error this was made from.
 */

/** A call the server refused, or that never completed (deadline, unreachable server). */
export class SwitchboardError extends Error {
  /**
   * @param {string} code gRPC status code name, e.g. "NOT_FOUND".
   * @param {string} message The server's human-readable message.
   * @param {SwitchboardErrorInit} [init]
   */
  constructor(code, message, init = {}) {
    const reason = init.reason ?? '';
    super(`${code}${reason ? ` ${reason}` : ''}: ${message}`, init.cause ? { cause: init.cause } : undefined);
    this.name = 'SwitchboardError';
    /** gRPC status code name, e.g. "NOT_FOUND". */
    this.code = code;
    /** The same code as a number (grpc.status). */
    this.grpcCode = CODE_NUMBERS.get(code) ?? grpc.status.UNKNOWN;
    /** The server's human-readable message (the `message` property also carries code and reason). */
    this.details = message;
    /** Stable, program-facing cause from ErrorInfo; "" when the status has none. */
    this.reason = reason;
    /** ErrorInfo.domain, "switchboard" for the server's own errors. */
    this.domain = init.domain ?? '';
    /** ErrorInfo metadata (e.g. the row's current "state" on STALE_FENCE). */
    this.metadata = { ...(init.metadata ?? {}) };
    /** @type {FieldViolation[]} BadRequest field violations, in the server's order. */
    this.violations = [...(init.violations ?? [])];
    /** @type {string[]} The request fields named by a BadRequest detail, in the server's order. */
    this.fieldViolations = this.violations.map((violation) => violation.field);
  }
}

/** @typedef {{ type_url?: string, typeUrl?: string, value: Buffer }} RawAny */

/**
 * Decodes the google.rpc.Status in an error's `grpc-status-details-bin`
 * trailer, unpacking the ErrorInfo and BadRequest details it carries.
 * @param {import('@grpc/grpc-js').ServiceError} error
 * @param {import('@grpc/proto-loader').PackageDefinition} packageDefinition
 * @returns {SwitchboardErrorInit | null} null when there is no (usable) trailer.
 */
function decodeStatusDetails(error, packageDefinition) {
  const values = error.metadata?.get(STATUS_DETAILS_KEY) ?? [];
  const raw = values[0];
  if (!Buffer.isBuffer(raw)) return null;
  const statusType = /** @type {MessageType} */ (packageDefinition['google.rpc.Status']);
  const status = /** @type {{ code: number, details: RawAny[] }} */ (statusType.deserialize(raw));
  // Trailers that disagree with the status line: keep the status line, skip the details.
  if (status.code !== error.code) return null;
  /** @type {SwitchboardErrorInit} */
  const init = {};
  for (const any of status.details ?? []) {
    // proto-loader's bundled google.protobuf.Any keeps its proto field names (type_url).
    const typeUrl = any.type_url ?? any.typeUrl ?? '';
    const typeName = typeUrl.slice(typeUrl.lastIndexOf('/') + 1);
    if (typeName !== ERROR_INFO && typeName !== BAD_REQUEST) continue;
    const type = /** @type {MessageType} */ (packageDefinition[typeName]);
    const detail = /** @type {any} */ (type.deserialize(any.value));
    if (typeName === ERROR_INFO) {
      init.reason = detail.reason;
      init.domain = detail.domain;
      init.metadata = detail.metadata;
    } else {
      init.violations = (init.violations ?? []).concat(
        detail.fieldViolations.map((/** @type {FieldViolation} */ v) => ({
          field: v.field,
          description: v.description,
        })),
      );
    }
  }
  return init;
}

/**
 * Converts whatever a grpc-js call failed with into a SwitchboardError.
 * @param {unknown} error
 * @param {import('@grpc/proto-loader').PackageDefinition} packageDefinition
 * @returns {SwitchboardError}
 */
export function toSwitchboardError(error, packageDefinition) {
  if (error instanceof SwitchboardError) return error;
  const serviceError = /** @type {import('@grpc/grpc-js').ServiceError} */ (error);
  if (!(error instanceof Error) || typeof serviceError.code !== 'number') {
    const message = error instanceof Error ? error.message : String(error);
    return new SwitchboardError('UNKNOWN', message, error instanceof Error ? { cause: error } : {});
  }
  let init = null;
  try {
    init = decodeStatusDetails(serviceError, packageDefinition);
  } catch {
    // An undecodable trailer: the status line alone still says what happened.
    init = null;
  }
  return new SwitchboardError(codeName(serviceError.code), serviceError.details ?? serviceError.message, {
    ...(init ?? {}),
    cause: serviceError,
  });
}
