// Starts the real Switchboard services (both, on SQLite in a temporary folder)
// as a child process, and stops them again.

import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { PACKAGE_DIR } from '../../src/protos.js';

/** The repository root: the Python project the services come from. */
const REPO_DIR = path.resolve(PACKAGE_DIR, '../..');
const STARTUP_TIMEOUT_MS = 30_000;
const STOP_GRACE_MS = 5_000;
const LISTENING = /^switchboard: (SessionService|DeliveryService) listening on (\S+)/;

/**
 * @typedef {object} RunningServices
 * @property {string} sessionAddress host:port of the SessionService.
 * @property {string} deliveryAddress host:port of the DeliveryService.
 * @property {() => string} output Everything the process printed so far.
 * @property {() => Promise<void>} stop SIGTERM, then SIGKILL after a grace period; removes the data folder.
 */

/**
 * The Python to run the services with: SWITCHBOARD_PYTHON, or the project's
 * .venv, resolved from this package's folder.
 * @returns {string}
 */
export function pythonExecutable() {
  return path.resolve(PACKAGE_DIR, process.env.SWITCHBOARD_PYTHON || '../../.venv/bin/python');
}

/**
 * Spawns `python -m switchboard_cli serve all` on free ports and waits for "ready".
 * @returns {Promise<RunningServices>}
 */
export async function startServices() {
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'switchboard-node-'));
  const child = spawn(
    pythonExecutable(),
    [
      '-m', 'switchboard_cli', 'serve', 'all',
      '--session-listen', '127.0.0.1:0',
      '--delivery-listen', '127.0.0.1:0',
      '--data-dir', dataDir,
      '--drain-grace', '1',
    ],
    { cwd: REPO_DIR, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, PYTHONUNBUFFERED: '1' } },
  );
  let output = '';
  /** @type {Promise<void>} */
  const exited = new Promise((resolve) => child.once('exit', () => resolve()));
  // Last resort: never leave the services running when this process exits without stopping them.
  const killOnExit = () => {
    child.kill('SIGKILL');
    rmSync(dataDir, { recursive: true, force: true });
  };
  process.once('exit', killOnExit);

  const stop = async () => {
    process.removeListener('exit', killOnExit);
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), STOP_GRACE_MS);
      await exited;
      clearTimeout(timer);
    }
    rmSync(dataDir, { recursive: true, force: true });
  };

  try {
    const addresses = await new Promise((resolve, reject) => {
      /** @type {Record<string, string>} */
      const found = {};
      let pending = '';
      const timer = setTimeout(
        () => reject(new Error(`services not ready after ${STARTUP_TIMEOUT_MS} ms:\n${output}`)),
        STARTUP_TIMEOUT_MS,
      );
      child.once('error', (error) => {
        clearTimeout(timer);
        reject(new Error(`cannot start ${pythonExecutable()}: ${error.message}`));
      });
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`services exited early (code ${code}, signal ${signal}):\n${output}`));
      });
      child.stderr.setEncoding('utf8').on('data', (chunk) => {
        output += chunk;
      });
      child.stdout.setEncoding('utf8').on('data', (chunk) => {
        output += chunk;
        pending += chunk;
        const lines = pending.split('\n');
        pending = lines.pop() ?? '';
        for (const line of lines) {
          const match = LISTENING.exec(line);
          if (match) found[match[1]] = match[2];
          if (line.startsWith('switchboard: ready')) {
            clearTimeout(timer);
            resolve(found);
          }
        }
      });
    });
    if (!addresses.SessionService || !addresses.DeliveryService) {
      throw new Error(`ready, but an address is missing:\n${output}`);
    }
    // A test that forgets stop() must not hang the run: the child no longer
    // keeps this process alive, and killOnExit ends it when this process exits.
    child.unref();
    /** @type {any} */ (child.stdout).unref?.();
    /** @type {any} */ (child.stderr).unref?.();
    return {
      sessionAddress: addresses.SessionService,
      deliveryAddress: addresses.DeliveryService,
      output: () => output,
      stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}
