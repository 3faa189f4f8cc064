// npm pack/publish hooks: `node scripts/protos.js copy` (prepack) puts the
// repository's Switchboard protos into this package's protos/ so the tarball is
// complete; `node scripts/protos.js clean` (postpack) removes the copy again, so a
// checkout keeps reading ../../protos and never a stale copy.

import { cpSync, rmSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const PACKAGE_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const SOURCE = path.resolve(PACKAGE_DIR, '../../protos/switchboard');
const COPY = path.join(PACKAGE_DIR, 'protos', 'switchboard');

const action = process.argv[2];
rmSync(COPY, { recursive: true, force: true });
if (action === 'copy') {
  cpSync(SOURCE, COPY, { recursive: true, filter: (source) => !source.endsWith('.json') });
} else if (action !== 'clean') {
  console.error('usage: node scripts/protos.js copy|clean');
  process.exit(2);
}
