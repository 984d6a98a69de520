// The compiled parts of Boost.Asio and Boost.Beast, once for the whole program: the server's build
// defines BOOST_ASIO_SEPARATE_COMPILATION and BOOST_BEAST_SEPARATE_COMPILATION for every translation
// unit that includes them (server/CMakeLists.txt), which then only declare what is defined here
// instead of compiling it inline again (18% of ws_session.cpp's compile time, more for the smaller
// files; Asio's and Beast's documentation, "Separate compilation").
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
