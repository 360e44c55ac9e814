#include "aiacc/comm/comm_hook.h"

#include <functional>

namespace aiacc::comm {
namespace {

class AllOf : public Work {
 public:
  AllOf(std::vector<std::shared_ptr<Work>> works, Transport& transport)
      : works_(std::move(works)), transport_(transport) {}
  void wait() override { waitAll(works_, /*host=*/false, abort()); }
  void synchronize() override { waitAll(works_, /*host=*/true, abort()); }
  Failure failure() const override { return firstFailure(works_); }

 private:
  std::function<void(const std::string&)> abort() {
    return [this](const std::string& why) { transport_.abort(why); };
  }
  std::vector<std::shared_ptr<Work>> works_;
  Transport& transport_;  // the hook's: DataParallel keeps it beyond the step's works
};

}  // namespace

std::shared_ptr<Work> allOf(std::vector<std::shared_ptr<Work>> works, Transport& transport) {
  for (const auto& w : works) AIACC_CHECK_INPUT(w != nullptr, "allOf: a null Work");
  return std::make_shared<AllOf>(std::move(works), transport);
}

}  // namespace aiacc::comm
