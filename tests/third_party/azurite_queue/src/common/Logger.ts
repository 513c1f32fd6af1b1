// queue_pg shim: Azurite's logger. The tests only turn it on or off; the server under test is
// `queue-pg azure`, which logs on its own.
export function configLogger(_enable: boolean, _logFile?: string): void {}
