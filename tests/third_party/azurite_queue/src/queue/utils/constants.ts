// queue_pg shim
export const DEFAULT_QUEUE_KEEP_ALIVE_TIMEOUT = 5;
