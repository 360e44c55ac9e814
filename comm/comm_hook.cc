#include "aiacc/comm/comm_hook.h"

namespace aiacc::comm {
namespace {

class AllOf : public Work {
 public:
  explicit AllOf(std::vector<std::shared_ptr<Work>> works) : works_(std::move(works)) {}
  void wait() override {
    waitAll(works_, /*host=*/false, [](const std::string&) {});
  }
  void synchronize() override {
    waitAll(works_, /*host=*/true, [](const std::string&) {});
  }

 private:
  std::vector<std::shared_ptr<Work>> works_;
};

}  // namespace

std::shared_ptr<Work> allOf(std::vector<std::shared_ptr<Work>> works) {
  for (const auto& w : works) AIACC_CHECK_INPUT(w != nullptr, "allOf: a null Work");
  return std::make_shared<AllOf>(std::move(works));
}

}  // namespace aiacc::comm
