// Anchor translation unit for the shared LibTorch precompiled header.
namespace aiacc {
int pchAnchor() { return 0; }
}  // namespace aiacc
