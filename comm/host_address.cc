// Host addresses of the rendezvous store (comm/launch_env.h): loopback or not, the local address
// toward a host, host:port.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <exception>
#include <string>
#include <utility>

#include "aiacc/comm/launch_env.h"
#include "aiacc/common/error.h"

namespace aiacc::comm {

bool isLoopbackHost(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::string localAddressToward(const std::string& host, const std::string& hint) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) {
    AIACC_THROW(InputError, "cannot resolve the store's host '", host, "': ", hint);
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string out;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char buf[INET_ADDRSTRLEN] = {0};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)) != nullptr) {
      out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  AIACC_CHECK_INPUT(!out.empty(), "no route to the store's host '", host, "': ", hint);
  return out;
}

std::pair<std::string, int> parseHostPort(const std::string& s, const std::string& what) {
  const auto colon = s.rfind(':');
  AIACC_CHECK_INPUT(colon != std::string::npos && colon > 0, what, " '", s, "' must be host:port");
  int port = 0;
  try {
    port = std::stoi(s.substr(colon + 1));
  } catch (const std::exception&) {
    port = -1;
  }
  AIACC_CHECK_INPUT(port > 0 && port < 65536, what, " '", s, "': bad port");
  return {s.substr(0, colon), port};
}

}  // namespace aiacc::comm
