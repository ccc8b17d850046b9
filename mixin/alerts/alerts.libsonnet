// Every alert group of the mixin, in the order alerts/chd.rules.yml lists them.
(import 'exporter.libsonnet')
+ (import 'verdict.libsonnet')
+ (import 'h2d.libsonnet')
+ (import 'pcie_rdma.libsonnet')
+ (import 'calibration.libsonnet')
+ (import 'fabric.libsonnet')
