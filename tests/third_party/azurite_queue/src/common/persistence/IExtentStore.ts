// queue_pg shim: the persistence setting the tests build (and the server under test ignores).
export interface StoreDestination {
  locationId: string;
  locationPath: string;
  maxConcurrency: number;
}
export type StoreDestinationArray = StoreDestination[];
