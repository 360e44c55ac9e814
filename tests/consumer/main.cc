// The example's program (examples/ddp_minimal/train_ddp.cc) as a user's own shared library
// (consumer_ddp, with aiacc::comm inside) or beside libaiacc_comm.so (consumer_shared): its main()
// was compiled as ddp_main (tests/consumer/CMakeLists.txt).
int ddp_main(int argc, char** argv);

int main(int argc, char** argv) { return ddp_main(argc, argv); }
