fn main() {
    print!("{}", autonomic_manager::crd::crds_yaml());
}
