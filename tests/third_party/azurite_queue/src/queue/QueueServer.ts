// queue_pg shim: in place of the in-process Azurite, the server under test is `queue-pg azure`,
// started before mocha by bench/azure_suite.py on the same host and port. start / close / clean
// do nothing: the tests' own before / after hooks stay as Azurite wrote them.
import QueueConfiguration from "./QueueConfiguration";

export default class QueueServer {
  public readonly config: QueueConfiguration;

  constructor(config: QueueConfiguration) {
    this.config = config;
  }

  public async start(): Promise<void> {}

  public async close(): Promise<void> {}

  public async clean(): Promise<void> {}
}
