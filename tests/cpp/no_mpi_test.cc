// A core built without MPI (make test-no-mpi): a process started for the MPI backend fails at
// init with an error that names what to install, instead of crashing or hanging.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "c_api.h"

TEST(NoMpi, MpiBackendAskedForNamesWhatToInstall) {
  setenv("BLUEFOG_BACKEND", "mpi", 1);
  ASSERT_EQ(bluefog_init(), -1);
  const std::string error = bluefog_last_error();
  EXPECT_NE(error.find("built without MPI"), std::string::npos) << error;
  EXPECT_NE(error.find("libopenmpi-dev"), std::string::npos) << error;
  EXPECT_NE(error.find("BLUEFOG_BACKEND=gloo"), std::string::npos) << error;
  EXPECT_EQ(bluefog_gloo_built(), 1);
}
