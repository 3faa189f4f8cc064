// Loads Switchboard's contracts (and the google.rpc status protos) at run time
// with @grpc/proto-loader: no generated code, no build step.

import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

/** The package's own directory (the one holding package.json). */
export const PACKAGE_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** The vendored google/rpc protos (status, error_details, code), and in a packed
 * package (npm pack copies them, see scripts/protos.js) the Switchboard protos. */
export const VENDORED_PROTO_DIR = path.join(PACKAGE_DIR, 'protos');

/**
 * Where the Switchboard protos are read from unless told otherwise: the
 * package's own `protos/` when it holds them (an installed package), else the
 * repository's `protos/` two levels above (a checkout). Override it with the
 * `protoDir` client option or the SWITCHBOARD_PROTO_DIR variable.
 */
export const DEFAULT_PROTO_DIR = existsSync(path.join(VENDORED_PROTO_DIR, 'switchboard'))
  ? VENDORED_PROTO_DIR
  : path.resolve(PACKAGE_DIR, '../../protos');

export const SESSION_PROTO = 'switchboard/session/v1/session_service.proto';
export const DELIVERY_PROTO = 'switchboard/delivery/v1/delivery_service.proto';
const RPC_PROTOS = ['google/rpc/status.proto', 'google/rpc/error_details.proto', 'google/rpc/code.proto'];

/** Options given to proto-loader; responses follow them (camelCase fields, String longs and enums). */
export const LOADER_OPTIONS = Object.freeze({
  keepCase: false,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});

/**
 * @typedef {object} Definitions
 * @property {string} protoDir The folder the Switchboard protos were read from.
 * @property {protoLoader.PackageDefinition} packageDefinition Every loaded type and service.
 * @property {grpc.GrpcObject} grpcObject The same, as grpc-js client constructors.
 */

/** @type {Map<string, Definitions>} */
const cache = new Map();

/**
 * Resolves which proto folder to use: the explicit argument, then
 * SWITCHBOARD_PROTO_DIR, then DEFAULT_PROTO_DIR.
 * @param {string} [protoDir]
 * @returns {string}
 */
export function resolveProtoDir(protoDir) {
  return path.resolve(protoDir || process.env.SWITCHBOARD_PROTO_DIR || DEFAULT_PROTO_DIR);
}

/**
 * Loads (once per folder) both services' protos and the google.rpc protos.
 * @param {string} [protoDir] Folder holding switchboard/{session,delivery}/v1/*.proto.
 * @returns {Definitions}
 */
export function loadDefinitions(protoDir) {
  const dir = resolveProtoDir(protoDir);
  const cached = cache.get(dir);
  if (cached) return cached;
  for (const file of [SESSION_PROTO, DELIVERY_PROTO]) {
    if (!existsSync(path.join(dir, file))) {
      throw new Error(
        `@switchboard/client: ${file} not found under ${dir}; pass protoDir or set SWITCHBOARD_PROTO_DIR`,
      );
    }
  }
  const packageDefinition = protoLoader.loadSync([SESSION_PROTO, DELIVERY_PROTO, ...RPC_PROTOS], {
    ...LOADER_OPTIONS,
    // google/protobuf/*.proto come from proto-loader's bundled copies.
    includeDirs: [dir, VENDORED_PROTO_DIR],
  });
  const definitions = {
    protoDir: dir,
    packageDefinition,
    grpcObject: grpc.loadPackageDefinition(packageDefinition),
  };
  cache.set(dir, definitions);
  return definitions;
}
