"""The Node preload that makes headless Qwen Code read a shell command's whole output before settling its result.

Qwen Code 0.24.4 without a pty (``tools.shell.enableInteractiveShell: false``, its default for ``-p``) runs a shell
command as ``bash -c CMD`` through ``child_process`` and settles the tool result at the child's ``exit`` event
(``ShellExecutionService.childProcessFallback``; it waits for ``close`` only when streaming). Node can emit
``exit`` before it has read what the command wrote to its stdout/stderr pipes, so on a busy machine the result
says ``Output: (empty)`` or holds the first part of the output, with no notice. Its pty path is worse on Linux:
node-pty drops output it has not read when the command exits (node-pty issues #72, #85, #726), cutting results at
~8 KB.

:data:`PRELOAD_SOURCE` is loaded into the CLI with ``NODE_OPTIONS=--require=...`` (no installed file is changed).
It holds a ``bash`` child's ``exit`` (and ``close``) event until its output has been read: until both pipes
ended, or until two turns of the event loop (each a fresh poll of the pipes) read nothing more. Everything the
command wrote before it exited was already in the pipes when ``exit`` arrived, so those polls drain it; no timer
and no machine speed is involved. A background process that keeps the pipe open and keeps writing delays the
result by at most :data:`MAX_AFTER_EXIT_BYTES` of further output (Qwen Code itself does not wait for it either).

Qwen Code relaunches itself twice (``cli-entry.js`` starts ``cli.js``, which starts itself again with more heap),
each time with its environment, so every one of its Node processes loads the preload. The preload removes its own
``--require`` from the ``NODE_OPTIONS`` of the ``bash`` children only: the agent's shell commands, and the Node
programs they run, see the environment the task gave.
"""

from __future__ import annotations

__all__ = ["MAX_AFTER_EXIT_BYTES", "PRELOAD_NAME", "PRELOAD_SOURCE"]

# The file name below HOME; the preload recognises its own --require by it.
PRELOAD_NAME = "polar-qwen-shell-drain.cjs"
MAX_AFTER_EXIT_BYTES = 8 * 1024 * 1024

_TEMPLATE = r"""'use strict';
// Polar's qwen-code adapter loads this with NODE_OPTIONS=--require (see gateway/harnesses/qwen_shell_drain.py):
// a `bash` child's 'exit' is held until what the command wrote has been read from its pipes.
const { ChildProcess } = require('node:child_process');

const MAX_AFTER_EXIT_BYTES = @MAX_AFTER_EXIT_BYTES@;
const QUIET_TURNS = 2;
const HOLD = Symbol('polarHeldExit');
const emit = ChildProcess.prototype.emit;

// Qwen Code runs its shell as `bash` looked up on PATH; a path to bash counts too.
function isBash(file) {
  return typeof file === 'string' && /(^|\/)bash$/.test(file);
}

function outputs(child) {
  return [child.stdout, child.stderr].filter((s) => s != null);
}

function ended(stream) {
  return stream.readableEnded || stream.destroyed;
}

function bytesRead(child) {
  return outputs(child).reduce((n, s) => n + (s.bytesRead ?? 0), 0);
}

function release(child) {
  const hold = child[HOLD];
  if (hold.released) return;
  hold.released = true;
  emit.call(child, 'exit', ...hold.exit);
  if (hold.close) emit.call(child, 'close', ...hold.close);
}

// The command wrote everything before it exited, so it is all in the pipes now: a turn of the event loop polls
// them afresh, and two turns in a row that read nothing mean nothing is left.
function waitForOutput(child) {
  const atExit = bytesRead(child);
  let last = atExit;
  let quiet = 0;
  const turn = () => {
    if (child[HOLD].released) return;
    const now = bytesRead(child);
    quiet = now === last ? quiet + 1 : 0;
    last = now;
    if (outputs(child).every(ended) || quiet >= QUIET_TURNS || now - atExit > MAX_AFTER_EXIT_BYTES) {
      release(child);
    } else {
      setImmediate(turn);
    }
  };
  setImmediate(turn);
}

ChildProcess.prototype.emit = function emitAfterOutput(event, ...args) {
  const hold = this[HOLD];
  if (event === 'exit' && hold === undefined && isBash(this.spawnfile) && !outputs(this).every(ended)) {
    this[HOLD] = { exit: args, close: null, released: false };
    waitForOutput(this);
    return true;
  }
  if (event === 'close' && hold !== undefined && !hold.released) {
    // Node emits 'close' only after the pipes closed as well: everything has been read.
    hold.close = args;
    release(this);
    return true;
  }
  return emit.call(this, event, ...args);
};

// Node's own split of NODE_OPTIONS: spaces separate, double quotes group, a backslash escapes inside quotes.
function splitNodeOptions(value) {
  const args = [];
  let quoted = false;
  let fresh = true;
  for (let i = 0; i < value.length; i++) {
    let char = value[i];
    if (char === '\\' && quoted) {
      char = value[++i] ?? '';
    } else if (char === ' ' && !quoted) {
      fresh = true;
      continue;
    } else if (char === '"') {
      quoted = !quoted;
      if (fresh) { args.push(''); fresh = false; }
      continue;
    }
    if (fresh) { args.push(char); fresh = false; } else { args[args.length - 1] += char; }
  }
  return args;
}

function withoutThisPreload(value) {
  const args = splitNodeOptions(value);
  const kept = [];
  for (let i = 0; i < args.length; i++) {
    if ((args[i] === '--require' || args[i] === '-r') && (args[i + 1] ?? '').endsWith('@PRELOAD_NAME@')) i++;
    else if (!(args[i].startsWith('--require=') && args[i].endsWith('@PRELOAD_NAME@'))) kept.push(args[i]);
  }
  return kept.map((a) => (/[\s"\\]/.test(a) ? `"${a.replace(/[\\"]/g, '\\$&')}"` : a)).join(' ');
}

// Qwen Code relaunches itself (cli-entry.js, then cli.js once more) with its environment, so every Node process
// keeps the --require; only the shell commands lose it: they and the Node programs they run see the task's
// NODE_OPTIONS and nothing of Polar's.
const spawnChild = ChildProcess.prototype.spawn;
ChildProcess.prototype.spawn = function spawnWithoutThisPreload(options) {
  if (options && isBash(options.file) && Array.isArray(options.envPairs)) {
    options.envPairs = options.envPairs.flatMap((pair) => {
      if (!pair.startsWith('NODE_OPTIONS=')) return [pair];
      const rest = withoutThisPreload(pair.slice('NODE_OPTIONS='.length));
      return rest ? [`NODE_OPTIONS=${rest}`] : [];
    });
  }
  return spawnChild.call(this, options);
};
"""
PRELOAD_SOURCE = _TEMPLATE.replace("@MAX_AFTER_EXIT_BYTES@", str(MAX_AFTER_EXIT_BYTES)).replace(
    "@PRELOAD_NAME@", PRELOAD_NAME
)
