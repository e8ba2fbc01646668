//! What a scheduler extension does with the per-node rail records: one
//! watch on every NodeRailRecord (an informer's list-then-watch), and a
//! line per change. The API server sends only the object that changed.
//!
//! ```sh
//! KUBECONFIG=~/.kube/config cargo run --example watch_rail_records
//! ```

use futures::{StreamExt, TryStreamExt};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use nodefabric::cluster::node_rail_record::NodeRailRecord;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let records: Api<NodeRailRecord> = Api::all(client);
    let mut events = watcher::watcher(records, watcher::Config::default()).boxed();
    while let Some(event) = events.try_next().await? {
        match event {
            Event::Apply(r) | Event::InitApply(r) => {
                let record = &r.spec.record;
                // Every GPU's closest NICs on the first rail, as a placement
                // decision would read them.
                let first: Vec<String> = record
                    .gpus
                    .iter()
                    .filter_map(|g| {
                        g.rails.iter().next().map(|(rail, c)| {
                            format!("{} {rail}={}", g.pci_bus_id, c.nics.join(","))
                        })
                    })
                    .collect();
                println!(
                    "{}: {} GPUs, {} NICs; {}",
                    r.name_any(),
                    record.gpus.len(),
                    record.nics.len(),
                    first.join("; ")
                );
            }
            Event::Delete(r) => println!("{}: deleted", r.name_any()),
            Event::Init | Event::InitDone => {}
        }
    }
    Ok(())
}
