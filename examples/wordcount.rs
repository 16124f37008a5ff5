//! Word count, the counterpart of Kafka Streams' `WordCountDemo`, run on the broker-free
//! `TestDriver` with 4 key ranges per partition.
//!
//! `cargo run --release --example wordcount`

use rill::prelude::*;

/// The topology: lines -> lower-case words -> count per word in `counts-store`.
fn topology() -> Result<Topology, TopologyError> {
    let builder = StreamsBuilder::new();
    builder
        .stream("streams-plaintext-input", StringSerde, StringSerde)
        .flat_map_values(|line: String| {
            line.to_lowercase()
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .group_by(|_key, word: &String| word.clone(), StringSerde, StringSerde)
        .count("counts-store")
        .to_stream()
        .to("streams-wordcount-output");
    builder.build()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let topology = topology()?;
    println!("{}", topology.describe());
    let driver = TestDriver::builder(topology)
        .parallelising_factor(4)
        .partitions("streams-plaintext-input", 2)
        .build()?;
    let input = driver.input_topic("streams-plaintext-input", StringSerde, StringSerde);
    for line in [
        "all streams lead to kafka",
        "hello kafka streams",
        "join kafka summit",
        "rill splits every partition into key ranges",
    ] {
        input.pipe_value(line.to_string());
    }
    let counts = driver.key_value_store("counts-store", StringSerde, I64Serde);
    let mut top: Vec<(String, i64)> = counts.all().into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    println!("top words:");
    for (word, n) in top.iter().take(10) {
        println!("{n:>4}  {word}");
    }
    driver.close()?;
    Ok(())
}
