//! Scrape-time collectors on fixture trees (`tests/fixtures/collectors/<tree>/{sys,proc}`,
//! described in that directory's README): exact exported values and labels, the error
//! accounting of the `odd` tree over two scrapes, filters and switches, trees that change
//! between scrapes, and `promtool check metrics` on every tree's output.

#[path = "../support/fixture_copy.rs"]
mod fixture_copy;
#[path = "../support/promtool.rs"]
mod promtool;

mod changes;
mod exposition;
mod filters;
mod infiniband;
mod odd;
mod real_sources;
mod roce_dual_rail;
mod scrape;
