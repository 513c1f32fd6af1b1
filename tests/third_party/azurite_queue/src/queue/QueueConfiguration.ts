// queue_pg shim: the configuration the tests build; only host and port mean anything here.
export default class QueueConfiguration {
  public readonly host: string;
  public readonly port: number;
  public readonly args: unknown[];

  constructor(host: string, port: number, ...rest: unknown[]) {
    this.host = host;
    this.port = port;
    this.args = rest;
  }
}
